"""GRPO with clip-higher, as pure tensor functions: advantages, the clipped loss, its metrics.

Follows the rStar2-Agent report (GRPO-RoC):

- Advantages are group-normalised outcome rewards, ``(r - mean(group)) / (std(group) + eps)``,
  the same for every token of a rollout. The std is the unbiased one and eps 1e-6, as in verl
  (the release's framework); the report writes the formula without saying.
- The policy loss is PPO's clipped surrogate with asymmetric bounds ``[1 - eps_low,
  1 + eps_high]`` = ``[0.8, 1.28]`` (clip-higher, from DAPO): a low-probability token with a
  positive advantage can grow further before its gradient is cut, which keeps entropy up.
- Aggregation is a token-level mean over every kept token of the step: each token weighs the
  same whatever the length of its rollout. ``seq_mean_token_mean`` (classic GRPO) is there for
  comparison, chosen once in config.
- No KL term and no entropy bonus by default (the report drops both); both exist as options.
  With ``kl_coef > 0`` the penalty is the k3 estimator against a frozen reference policy.
- Dual clip (verl's ``clip_ratio_c``, on by default there and so in the release's runs, but not
  in the report) is optional: ``dual_clip_c=None`` leaves it off.

Masks: tool-response and prompt tokens have mask 0; they get zero loss and, because the loss
multiplies by the mask (and never divides by a masked value), exactly zero gradient.

Shapes: ``B`` sequences, ``T`` target positions (sequence length - 1), ``V`` vocabulary;
``G`` rollouts per group, ``P`` groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean"]


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``rewards`` (P, G) -> advantages (P, G); a group of equal rewards gets all zeros."""
    mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)  # (P, G)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) -> log p(target) (B, T), computed in float32."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V) -> entropy of each next-token distribution (B, T)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)  # (B, T)


@dataclass(frozen=True)
class ClipSettings:
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = None


@dataclass(frozen=True)
class PolicyLoss:
    """Per-token surrogate loss and which tokens the clip acted on."""

    loss: torch.Tensor  # (B, T), not yet masked or aggregated
    clipped: torch.Tensor  # (B, T) bool: the clipped branch was the one taken
    ratio: torch.Tensor  # (B, T)


def clipped_policy_loss(
    logprobs: torch.Tensor,  # (B, T), with gradient
    old_logprobs: torch.Tensor,  # (B, T), no gradient
    advantages: torch.Tensor,  # (B,)
    clip: ClipSettings,
) -> PolicyLoss:
    """PPO's pessimistic clipped surrogate, negated to a loss, with clip-higher bounds."""
    log_ratio = logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.unsqueeze(-1)  # (B, 1)
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * torch.clamp(ratio, 1.0 - clip.eps_low, 1.0 + clip.eps_high)  # (B, T)
    loss = torch.maximum(unclipped, clipped)  # (B, T)
    was_clipped = clipped > unclipped  # (B, T)
    if clip.dual_clip_c is not None:
        # For negative advantages, bound the loss at -c * A so a huge ratio cannot blow it up.
        bound = -adv * clip.dual_clip_c  # (B, 1)
        dual = torch.minimum(loss, bound)
        was_clipped = was_clipped | ((adv < 0) & (loss > bound))
        loss = torch.where(adv < 0, dual, loss)
    return PolicyLoss(loss=loss, clipped=was_clipped, ratio=ratio)


def token_mean_scales(kept: torch.Tensor) -> torch.Tensor:
    """kept tokens per sequence (N,) -> per-sequence weight (N,): every kept token of the step
    weighs 1 / (all kept tokens), whatever its sequence (the report's rule)."""
    return torch.full_like(kept, 1.0) / kept.sum().clamp(min=1)


def seq_mean_token_mean_scales(kept: torch.Tensor) -> torch.Tensor:
    """kept (N,) -> (N,): a mean within each sequence, then a mean over sequences."""
    n_seqs = (kept > 0).sum().clamp(min=1)
    return 1.0 / kept.clamp(min=1) / n_seqs


AGGREGATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "token_mean": token_mean_scales,
    "seq_mean_token_mean": seq_mean_token_mean_scales,
}


def sequence_scales(kept: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """kept tokens per sequence of the whole step (N,) -> each sequence's token weight (N,).

    Computed once for the step (or mini-batch); a micro-batch's token weights are then
    ``mask * scale[rows]``, so how the step is cut into micro-batches cannot change the loss.
    """
    return AGGREGATIONS[aggregation](kept.float())


def loss_weights(mask: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """mask (B, T) of a whole step -> token weights (B, T) that sum to 1 over kept tokens."""
    mask = mask.float()
    return mask * sequence_scales(mask.sum(dim=1), aggregation).unsqueeze(-1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): the k3 estimator of KL(policy || reference), non-negative per token."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): k3 estimate of KL(old || new), the drift of this update."""
    return k3_kl(old_logprobs, logprobs)


def weighted_sum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, T), (B, T) -> scalar. Masked positions have weight 0, so they add exactly 0."""
    return (values * weights).sum()
