"""grpo.py: advantages, the clipped loss against hand computation, masks and aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.grpo import (
    ClipSettings,
    clipped_policy_loss,
    entropy_from_logits,
    group_advantages,
    k3_kl,
    loss_weights,
    token_logprobs,
    weighted_sum,
)

CLIP = ClipSettings(eps_low=0.2, eps_high=0.28)


def test_group_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards)
    std0 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert adv[0].tolist() == pytest.approx(
        [0.5 / std0, -0.5 / std0, -0.5 / std0, 0.5 / std0], rel=1e-5
    )
    std1 = math.sqrt((3 * 0.25**2 + 0.75**2) / 3)
    assert adv[1].tolist() == pytest.approx([0.25 / std1] * 3 + [-0.75 / std1], rel=1e-5)
    assert adv[2].tolist() == [0.0] * 4  # equal rewards: no signal, no NaN
    assert adv.sum(dim=1).abs().max() < 1e-5


def hand_loss(ratio: float, adv: float, eps_low: float = 0.2, eps_high: float = 0.28) -> float:
    return max(-adv * ratio, -adv * min(max(ratio, 1 - eps_low), 1 + eps_high))


def test_loss_matches_a_hand_computation() -> None:
    ratios = torch.tensor([[1.0, 1.1, 1.5], [0.5, 0.9, 1.3]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]])
    new = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = clipped_policy_loss(new, old, adv, CLIP)
    total = weighted_sum(out.loss, loss_weights(mask, "token_mean"))
    expected = [
        hand_loss(r, a) for row, a in zip(ratios.tolist(), [2.0, -1.0], strict=True) for r in row
    ]
    expected_mean = (sum(expected[:3]) + sum(expected[3:5])) / 5  # the masked token is left out
    assert total.item() == pytest.approx(expected_mean, rel=1e-6)
    assert out.clipped.tolist() == [[False, False, True], [True, False, False]]


def loss_and_grad(ratio: float, adv: float, clip: ClipSettings = CLIP) -> tuple[float, float]:
    new = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = clipped_policy_loss(new, torch.zeros(1, 1), torch.tensor([adv]), clip)
    out.loss.sum().backward()
    assert new.grad is not None
    return out.loss.item(), new.grad.item()


def test_clip_higher_is_asymmetric() -> None:
    # Positive advantage: the ratio may rise to 1.28 before the gradient stops ...
    assert loss_and_grad(1.25, 1.0)[1] == pytest.approx(-1.25)
    assert loss_and_grad(1.30, 1.0)[1] == 0.0
    # ... where a symmetric 0.2 clip would already have stopped it at 1.2.
    assert loss_and_grad(1.25, 1.0, ClipSettings(0.2, 0.2))[1] == 0.0
    # Negative advantage: the lower bound stays at 0.8.
    assert loss_and_grad(0.81, -1.0)[1] == pytest.approx(0.81)
    assert loss_and_grad(0.79, -1.0)[1] == 0.0
    # Outside the bounds on the side that does not help the objective, no clipping happens.
    assert loss_and_grad(0.5, 1.0)[1] == pytest.approx(-0.5)
    assert loss_and_grad(2.0, -1.0)[1] == pytest.approx(2.0)


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    loss, grad = loss_and_grad(5.0, -1.0, ClipSettings(0.2, 0.28, dual_clip_c=3.0))
    assert loss == pytest.approx(3.0) and grad == 0.0
    assert loss_and_grad(2.0, -1.0, ClipSettings(0.2, 0.28, dual_clip_c=3.0))[0] == pytest.approx(
        2.0
    )


def test_masked_tokens_get_exactly_zero_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    old = token_logprobs(logits.detach() + 0.01 * torch.randn(2, 5, 11), targets)
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 1, 1, 0]], dtype=torch.float32)
    out = clipped_policy_loss(token_logprobs(logits, targets), old, torch.tensor([1.5, -0.7]), CLIP)
    weighted_sum(out.loss, loss_weights(mask, "token_mean")).backward()
    assert logits.grad is not None
    grad_norm_per_token = logits.grad.abs().sum(dim=-1)  # (B, T)
    assert torch.all(grad_norm_per_token[mask == 0] == 0.0)
    assert not out.clipped.any()
    assert torch.all(grad_norm_per_token[mask == 1] > 0.0)


def test_token_mean_weighs_every_kept_token_equally_across_sequences() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    token = loss_weights(mask, "token_mean")
    assert token.sum().item() == pytest.approx(1.0)
    assert token[mask == 1].tolist() == pytest.approx([1 / 8] * 8)
    seq = loss_weights(mask, "seq_mean_token_mean")
    assert seq[0, 0].item() == pytest.approx(1 / 12) and seq[1, 0].item() == pytest.approx(1 / 4)


def test_micro_batch_split_gives_the_same_loss_and_gradient() -> None:
    torch.manual_seed(1)
    lengths = [7, 2, 5, 3]
    mask = torch.zeros(4, 8)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    new = torch.randn(4, 8, requires_grad=True)
    old = new.detach() + 0.1 * torch.randn(4, 8)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    weights = loss_weights(mask, "token_mean")  # computed once for the whole step

    whole = weighted_sum(clipped_policy_loss(new, old, adv, CLIP).loss, weights)
    (grad_whole,) = torch.autograd.grad(whole, new)
    parts = [
        weighted_sum(clipped_policy_loss(new[idx], old[idx], adv[idx], CLIP).loss, weights[idx])
        for idx in ([0, 3], [1], [2])
    ]
    summed = torch.stack(parts).sum()
    (grad_parts,) = torch.autograd.grad(summed, new)
    assert summed.item() == pytest.approx(whole.item(), rel=1e-6)
    assert torch.allclose(grad_parts, grad_whole)
    # A per-micro-batch mean (the mistake this guards against) would differ.
    naive = torch.stack(
        [
            weighted_sum(
                clipped_policy_loss(new[i], old[i], adv[i], CLIP).loss,
                loss_weights(mask[i], "token_mean"),
            )
            for i in ([0, 3], [1], [2])
        ]
    ).mean()
    assert naive.item() != pytest.approx(whole.item(), rel=1e-3)


def test_logprobs_entropy_and_kl() -> None:
    logits = torch.zeros(1, 2, 4)
    logprobs = token_logprobs(logits, torch.tensor([[0, 3]]))
    assert logprobs.flatten().tolist() == pytest.approx([-math.log(4)] * 2)
    assert entropy_from_logits(logits).flatten().tolist() == pytest.approx([math.log(4)] * 2)
    peaked = torch.tensor([[[100.0, 0.0, 0.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    a = torch.tensor([[-1.0, -2.0]])
    assert k3_kl(a, a).tolist() == [[0.0, 0.0]]
    assert torch.all(k3_kl(a, torch.tensor([[-1.5, -0.5]])) > 0)
