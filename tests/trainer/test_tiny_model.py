"""tiny_model.py: the tokenizer built in code and the tiny model built from a config."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from trainer.config import TinyModelConfig
from trainer.tiny_model import PROTOCOL_TOKENS, SPECIAL_TOKENS, build_model
from trainer.toy_task import tokenizer_corpus


def test_text_round_trips_and_markers_are_single_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    text = tokenizer_corpus(1, seed=9)[0] + " unseen text: ünïcode ✓ 12345"
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text
    for marker in SPECIAL_TOKENS + PROTOCOL_TOKENS:
        assert len(tokenizer.encode(marker)) == 1, marker
    assert tokenizer.encode("907") == [tokenizer.convert_tokens_to_ids(d) for d in "907"]


def test_no_learned_token_spans_a_marker(tokenizer: PreTrainedTokenizerFast) -> None:
    markers = SPECIAL_TOKENS + PROTOCOL_TOKENS
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        assert text in markers or not any(m in text for m in markers), text


def test_tiny_model_shapes(tokenizer: PreTrainedTokenizerFast) -> None:
    model = build_model(tokenizer, TinyModelConfig(hidden_size=32, num_layers=1))
    ids = torch.tensor([tokenizer.encode("What is 2 + 2?")])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    assert model.config.eos_token_id == tokenizer.eos_token_id
