"""Tiny models for CPU runs and tests: a BPE tokenizer trained in code and a small Qwen2.

Nothing is downloaded. The tokenizer is trained on the text it will see (the toy task's
transcripts, prompt included): byte-level, so any text round-trips; digits are single tokens,
so copying a number from a tool response into an answer is the same tokens both times; merges
may cross spaces, so the long fixed system prompt costs few tokens. The chat markers and the
protocol tags are single tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trainer.chat import CHAT_TEMPLATE, EOS, IM_END, IM_START, PAD
from trainer.config import TinyModelConfig
from trainer.tools import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
)

SPECIAL_TOKENS = (PAD, IM_START, IM_END)
PROTOCOL_TOKENS = (CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


def build_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus``, wrapped for transformers, with a ChatML template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    bpe = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on the text between the markers, so that no learned token spans one: a token like
    # "</tool_call><|im_end|>" could never be produced by encoding, but could be generated.
    markers = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + PROTOCOL_TOKENS))
    pieces = (piece for text in corpus for piece in markers.split(text) if piece)
    tokenizer.train_from_iterator(pieces, bpe)
    tokenizer.add_tokens(
        [AddedToken(tag, normalized=False, special=False) for tag in PROTOCOL_TOKENS]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, shape: TinyModelConfig) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 sized by ``shape``, its vocabulary the tokenizer's."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)
