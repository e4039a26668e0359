"""sft.py: only the assistant's tokens are trained on, and the loss goes down."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from trainer.chat import EOS
from trainer.config import SftConfig, TinyModelConfig
from trainer.modeling import Policy
from trainer.sft import encode_conversation, run_sft
from trainer.tiny_model import build_model
from trainer.toy_task import toy_conversations, toy_problems, toy_transcript


def tiny_policy(tokenizer: PreTrainedTokenizerFast) -> Policy:
    torch.manual_seed(0)
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    )
    return Policy(model, tokenizer, torch.device("cpu"), None)


def test_only_assistant_tokens_are_trainable(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = toy_transcript(toy_problems(1, seed=1)[0])
    sample = encode_conversation(tiny_policy(tokenizer), messages)
    assert len(sample.token_ids) == len(sample.loss_mask)
    trained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    text = tokenizer.decode(trained, skip_special_tokens=False)
    assert text == messages[1]["content"] + messages[3]["content"] + EOS
    untrained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if not m]
    assert "Tool call success" in tokenizer.decode(untrained)


def test_toy_transcripts_mix_tool_use_and_direct_answers() -> None:
    conversations = toy_conversations(200, seed=0, direct_share=0.3)
    direct = sum(len(c) == 2 for c in conversations)
    assert 40 < direct < 80
    assert all(len(c) in (2, 4) for c in conversations)


def test_sft_lowers_the_loss(tokenizer: PreTrainedTokenizerFast) -> None:
    policy = tiny_policy(tokenizer)
    conversations = toy_conversations(32, seed=0, direct_share=0.0)
    losses = run_sft(
        policy, conversations, SftConfig(steps=30, batch_size=8, lr=3e-3), progress=False
    )
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
