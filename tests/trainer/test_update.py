"""update.py: the GRPO step on a real (tiny) model: packing, invariance, masks, metrics."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from trainer.config import LossConfig, OptimConfig, TinyModelConfig
from trainer.modeling import Policy, enable_activation_checkpointing
from trainer.tiny_model import build_model
from trainer.update import (
    Sample,
    grpo_update,
    pack_micro_batches,
    sequence_logprobs,
)


def policy_of(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Policy:
    torch.manual_seed(seed)
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    )
    return Policy(model, tokenizer, torch.device("cpu"), None)


def samples_of(tokenizer: PreTrainedTokenizerFast) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i, n in enumerate([9, 14, 5, 20, 11, 7]):
        ids = [rng.randrange(3, len(tokenizer)) for _ in range(n)]
        mask = [0] * 3 + [rng.choice([0, 1, 1]) for _ in range(n - 3)]
        out.append(Sample(ids, mask, advantage=1.0 if i % 2 else -1.0))
    return out


def params(policy: Policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])


def test_pack_micro_batches_respects_the_budget() -> None:
    lengths = [5, 30, 12, 12, 40, 3]
    batches = pack_micro_batches(lengths, token_budget=40)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 40
    assert pack_micro_batches([100, 5], token_budget=10) == [[0], [1]]


def test_packing_does_not_change_the_update(tokenizer: PreTrainedTokenizerFast) -> None:
    results = []
    for budget in (10_000, 25):  # one micro-batch, or one or two sequences each
        policy = policy_of(tokenizer)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
        loss, optim = LossConfig(), OptimConfig(micro_batch_tokens=budget, grad_clip=1e9)
        metrics = grpo_update(
            policy, optimizer, samples_of(tokenizer), loss, optim, random.Random(0)
        )
        results.append((params(policy), metrics))
    (p_one, m_one), (p_many, m_many) = results
    assert torch.allclose(p_one, p_many, atol=1e-6)
    assert m_one["loss"] == pytest.approx(m_many["loss"], rel=1e-5)
    assert m_one["entropy"] == pytest.approx(m_many["entropy"], rel=1e-5)


def test_fully_masked_samples_do_not_move_the_weights(tokenizer: PreTrainedTokenizerFast) -> None:
    policy = policy_of(tokenizer)
    before = params(policy)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=0.1, weight_decay=0.0)
    masked = [
        Sample(s.token_ids, [0] * len(s.token_ids), s.advantage) for s in samples_of(tokenizer)
    ]
    metrics = grpo_update(policy, optimizer, masked, LossConfig(), OptimConfig(), random.Random(0))
    assert torch.equal(params(policy), before)
    assert metrics["trained_tokens"] == 0.0 and metrics["grad_norm"] == 0.0


def test_update_moves_likelihood_with_the_advantage(tokenizer: PreTrainedTokenizerFast) -> None:
    policy = policy_of(tokenizer)
    samples = samples_of(tokenizer)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=3e-3, weight_decay=0.0)

    def masked_sums() -> list[float]:
        lps = sequence_logprobs(policy, samples, 10_000)
        return [
            float((lp * torch.tensor(s.loss_mask[1:], dtype=torch.float32)).sum())
            for lp, s in zip(lps, samples, strict=True)
        ]

    before = masked_sums()
    for _ in range(3):
        metrics = grpo_update(
            policy, optimizer, samples, LossConfig(), OptimConfig(), random.Random(0)
        )
    after = masked_sums()
    for s, b, a in zip(samples, before, after, strict=True):
        assert (a > b) == (s.advantage > 0)
    assert 0.0 <= metrics["clip_frac"] <= 1.0 and metrics["approx_kl"] >= 0.0


def test_several_mini_batches_clip_and_report_it(tokenizer: PreTrainedTokenizerFast) -> None:
    policy = policy_of(tokenizer)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=20.0)  # large steps: ratios move
    loss, optim = LossConfig(eps_low=0.2, eps_high=0.28), OptimConfig(mini_batches=3, epochs=2)
    metrics = grpo_update(policy, optimizer, samples_of(tokenizer), loss, optim, random.Random(0))
    assert metrics["clip_frac"] > 0.0
    assert metrics["approx_kl"] > 0.0


def test_kl_needs_a_reference(tokenizer: PreTrainedTokenizerFast) -> None:
    policy = policy_of(tokenizer)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    samples, loss = samples_of(tokenizer), LossConfig(kl_coef=0.1)
    with pytest.raises(ValueError, match="reference"):
        grpo_update(policy, optimizer, samples, loss, OptimConfig(), random.Random(0))
    reference = policy_of(tokenizer, seed=1)
    metrics = grpo_update(
        policy, optimizer, samples, loss, OptimConfig(), random.Random(0), reference
    )
    assert metrics["loss"] == metrics["loss"]  # finite, not NaN


def test_activation_checkpointing_gives_the_same_update(tokenizer: PreTrainedTokenizerFast) -> None:
    results = []
    for checkpointing in (False, True):
        policy = policy_of(tokenizer)
        if checkpointing:
            enable_activation_checkpointing(policy.model)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
        grpo_update(
            policy, optimizer, samples_of(tokenizer), LossConfig(), OptimConfig(), random.Random(0)
        )
        results.append(params(policy))
    assert torch.allclose(results[0], results[1], atol=1e-6)


def test_the_engines_logprob_gap_is_measured_on_trained_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """rollout_logprob_gap: mean |trainer - engine| over the tokens the policy wrote. Zero when
    the engine sampled with the trainer's weights; the offset when it did not; absent when
    no sample carries the engine's logprobs."""
    policy = policy_of(tokenizer)
    plain = samples_of(tokenizer)
    own = sequence_logprobs(policy, plain, 10_000)

    def with_engine(offset: float) -> list[Sample]:
        return [
            Sample(s.token_ids, s.loss_mask, s.advantage, [0.0, *(lp + offset).tolist()])
            for s, lp in zip(plain, own, strict=True)
        ]

    def gap(samples: list[Sample]) -> float | None:
        fresh = policy_of(tokenizer)
        optimizer = torch.optim.SGD(fresh.model.parameters(), lr=0.0)
        metrics = grpo_update(
            fresh, optimizer, samples, LossConfig(), OptimConfig(), random.Random(0)
        )
        return metrics.get("rollout_logprob_gap")

    assert gap(with_engine(0.0)) == pytest.approx(0.0, abs=1e-6)
    assert gap(with_engine(0.25)) == pytest.approx(0.25, abs=1e-5)
    assert gap(plain) is None
