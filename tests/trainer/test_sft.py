"""sft.py: only the assistant's tokens are trained on, the loss goes down, and the run can
stop once the held-out answers are right."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerFast

import trainer.sft as sft_module
from trainer.chat import EOS
from trainer.config import SftConfig, TinyModelConfig, TrainConfig
from trainer.modeling import Policy
from trainer.sft import (
    check_conversations,
    encode_conversation,
    final_turn,
    fine_tune,
    run_sft,
    whole_probability,
)
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


def test_final_turn_is_the_answer_after_the_tool(tokenizer: PreTrainedTokenizerFast) -> None:
    problem = toy_problems(1, seed=1)[0]
    sample = final_turn(encode_conversation(tiny_policy(tokenizer), toy_transcript(problem)))
    trained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == f"<answer>\\boxed{{{problem.answer}}}</answer>{EOS}"


def test_whole_probability_is_the_product_over_the_trained_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    policy = tiny_policy(tokenizer)
    conversations = check_conversations(SftConfig(stop_probability=0.5, check_transcripts=3))
    assert len(conversations) == 3 and all(len(c) == 4 for c in conversations)  # all with the tool
    samples = [final_turn(encode_conversation(policy, m)) for m in conversations]
    with torch.no_grad():
        one = []
        for s in samples:
            logits = policy.model(torch.tensor([s.token_ids])).logits[0, :-1].log_softmax(-1)
            picked = logits.gather(-1, torch.tensor(s.token_ids[1:]).unsqueeze(-1))[:, 0]
            one.append(math.exp(float((picked * torch.tensor(s.loss_mask[1:])).sum())))
    assert math.isclose(whole_probability(policy, samples), sum(one) / 3, rel_tol=1e-4)


def test_sft_stops_once_the_held_out_answers_are_right(tokenizer: PreTrainedTokenizerFast) -> None:
    conversations = toy_conversations(32, seed=0, direct_share=0.0)
    config = SftConfig(steps=30, batch_size=8, stop_probability=0.0, check_every=4)
    check = check_conversations(config)
    losses = run_sft(tiny_policy(tokenizer), conversations, config, progress=False, check=check)
    assert len(losses) == 4  # any probability reaches 0: stopped at the first check
    never = SftConfig(steps=6, batch_size=8, stop_probability=1.1, check_every=2)
    losses = run_sft(tiny_policy(tokenizer), conversations, never, progress=False, check=check)
    assert len(losses) == 6


def test_toy_curriculum_copies_first_then_mixes(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    sft = SftConfig(
        enabled=True,
        toy_transcripts=32,
        toy_direct_share=0.5,
        steps=30,
        batch_size=8,
        stop_probability=0.0,
        check_every=2,
        toy_copy_first=True,
        mix_steps=3,
    )
    config = TrainConfig(sft=sft)
    seen: list[int] = []
    real = sft_module.run_sft

    def spy(policy: Policy, conversations: Sequence[Any], *args: Any, **kwargs: Any) -> list[float]:
        seen.append(sum(len(c) == 2 for c in conversations))  # direct answers in the phase
        return real(policy, conversations, *args, **kwargs)

    monkeypatch.setattr(sft_module, "run_sft", spy)
    losses = fine_tune(tiny_policy(tokenizer), config, progress=False)
    assert len(losses) == 2 + 3  # stopped at the first check, then the mixing steps
    assert seen[0] == 0 and seen[1] > 0  # tool transcripts only, then the mix
