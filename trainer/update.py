"""One GRPO policy update on one process: old logprobs, packed micro-batches, one AdamW step.

Given the kept rollouts of an RL step (token ids, loss masks, advantages):

1. *Old logprobs* are recomputed with the current weights, before any update (as the release
   does), rather than taken from the generator: the generation engine's numerics differ from
   the trainer's, and the PPO ratio must compare like with like.
2. The rollouts are split into ``mini_batches`` (one optimizer step each; 1 = fully on-policy,
   the release's setting) and each mini-batch into *micro-batches* packed by a token budget
   (rows x longest row), longest first.
3. Each micro-batch adds ``sum(loss * weight)`` to the gradient, where the weights were fixed
   for the whole mini-batch (``grpo.sequence_scales``): the token-mean is exact however the
   sequences are packed.
4. Gradients are clipped by global norm, then AdamW steps.

Metrics are means over every kept (mask 1) token of the step.

Data parallel (FSDP, ``parallel.DataParallel``): every rank holds all the samples, computes
old logprobs for and trains on its share of them (dealt out longest first), and
weights its tokens by the token count of the *whole* mini-batch; FSDP sums the gradients
(``fsdp.shard_policy`` sets the divide factor to 1), so the update is one process's. A sharded
forward is a collective, so ranks with fewer micro-batches run empty ones (one pad token pair,
weight 0) until all have run as many.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from trainer.config import LossConfig, OptimConfig
from trainer.grpo import (
    approx_kl,
    clipped_policy_loss,
    entropy_from_logits,
    k3_kl,
    sequence_scales,
    token_logprobs,
)
from trainer.modeling import Policy
from trainer.parallel import SINGLE, DataParallel

SUMMED = ("loss", "clip_frac", "approx_kl", "entropy", "ratio_mean")  # added up over ranks


@dataclass(frozen=True)
class Sample:
    """One kept rollout: the whole sequence and, per token, whether the loss covers it."""

    token_ids: list[int]  # prompt + response
    loss_mask: list[int]  # same length: 1 where the policy wrote the token
    advantage: float
    # The generating engine's log-probability of each token, aligned with token_ids (0 where
    # the policy did not write it); None: not comparable (sampled at another temperature).
    sampled_logprobs: list[float] | None = None


@dataclass
class MicroBatch:
    rows: list[int]  # indices into the step's samples
    input_ids: torch.Tensor  # (B, L), right-padded
    attention_mask: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, T) = input_ids[:, 1:], T = L - 1
    mask: torch.Tensor  # (B, T) float: 1 where the target token is trained on
    advantages: torch.Tensor  # (B,)


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that rows x longest row stays within ``token_budget``, longest first.
    A sequence longer than the budget gets a micro-batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        # Sorted longest first, so a batch's first row is its longest.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def collate(
    samples: Sequence[Sample], rows: list[int], pad_id: int, device: torch.device
) -> MicroBatch:
    width = max(len(samples[i].token_ids) for i in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, L)
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)  # (B, L)
    for r, i in enumerate(rows):
        n = len(samples[i].token_ids)
        ids[r, :n] = torch.tensor(samples[i].token_ids)
        attention[r, :n] = 1
        mask[r, :n] = torch.tensor(samples[i].loss_mask, dtype=torch.float32)
    advantages = torch.tensor([samples[i].advantage for i in rows], dtype=torch.float32)
    return MicroBatch(
        rows=rows,
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        targets=ids[:, 1:].to(device),
        mask=mask[:, 1:].to(device),  # a token is trained on where it is the target
        advantages=advantages.to(device),
    )


def forward(policy: Policy, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (log p(target) (B, T), logits (B, T, V))."""
    with policy.autocast():
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1]  # (B, T, V): position t predicts token t + 1
    return token_logprobs(logits, batch.targets), logits


def rank_rows(samples: Sequence[Sample], rows: Sequence[int], dp: DataParallel) -> list[int]:
    """The rows of ``rows`` that rank ``dp.rank`` owns. All the samples are dealt out to the
    ranks longest first, once: the rank that computes a sample's old logprobs trains on it."""
    if not dp.distributed:
        return list(rows)
    ordered = sorted(range(len(samples)), key=lambda i: -len(samples[i].token_ids))
    mine = set(ordered[dp.rank :: dp.world])
    return [i for i in rows if i in mine]


def _packs(samples: Sequence[Sample], rows: Sequence[int], token_budget: int) -> list[list[int]]:
    lengths = [len(samples[i].token_ids) for i in rows]
    return [[rows[j] for j in group] for group in pack_micro_batches(lengths, token_budget)]


def micro_batches(
    policy: Policy,
    samples: Sequence[Sample],
    rows: Sequence[int],
    token_budget: int,
    dp: DataParallel = SINGLE,
) -> Iterator[MicroBatch]:
    """This rank's micro-batches of ``rows``; as many on every rank (empty ones pad)."""
    mine = _packs(samples, rank_rows(samples, rows, dp), token_budget)
    most = len(mine)
    if dp.distributed:  # every rank can count every rank's packs: all hold all samples
        shares = [rank_rows(samples, rows, DataParallel(r, dp.world)) for r in range(dp.world)]
        most = max(len(_packs(samples, share, token_budget)) for share in shares)
    pad = policy.tokenizer.pad_token_id
    for group in mine:
        yield collate(samples, group, pad, policy.device)
    for _ in range(most - len(mine)):
        yield _empty_batch(pad, policy.device)


def _empty_batch(pad_id: int, device: torch.device) -> MicroBatch:
    """One pair of pad tokens, trained on with weight 0: keeps a rank in step with the rest."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long)
    return MicroBatch(
        rows=[],
        input_ids=ids.to(device),
        attention_mask=torch.ones_like(ids).to(device),
        targets=ids[:, 1:].to(device),
        mask=torch.zeros((1, 1), dtype=torch.float32, device=device),
        advantages=torch.zeros(1, dtype=torch.float32, device=device),
    )


@torch.no_grad()
def sequence_logprobs(
    policy: Policy,
    samples: Sequence[Sample],
    token_budget: int,
    dp: DataParallel = SINGLE,
) -> list[torch.Tensor]:
    """Per sample, log p(token t+1 | tokens <= t) under the current weights: (len - 1,) each.
    With several ranks, only this rank's samples are computed (the others stay empty)."""
    was_training = policy.model.training
    policy.model.eval()  # no dropout: these are the reference numbers of the ratio
    out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
    for batch in micro_batches(policy, samples, range(len(samples)), token_budget, dp):
        logprobs, _ = forward(policy, batch)
        for r, i in enumerate(batch.rows):
            out[i] = logprobs[r, : len(samples[i].token_ids) - 1].float()
    policy.model.train(was_training)
    return out


def policy_logprobs(policy: Policy, ids: Sequence[int], start: int = 1) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= ``start``, under the current weights: one sequence,
    to set beside an engine's prompt logprobs of it."""
    [logprobs] = sequence_logprobs(policy, [Sample(list(ids), [1] * len(ids), 0.0)], 1 << 16)
    return logprobs[start - 1 :].tolist()  # logprobs[t - 1] is log p(ids[t] | ids[:t])


def _pad_rows(values: list[torch.Tensor], batch: MicroBatch) -> torch.Tensor:
    """Per-sample values laid out as ``batch.targets`` (B, T), zeros past each end."""
    out = torch.zeros(batch.targets.shape, dtype=torch.float32)
    for r, i in enumerate(batch.rows):
        out[r, : values[i].shape[0]] = values[i]
    return out.to(batch.targets.device)


@dataclass(frozen=True)
class _Before:
    """What the update compares against, computed before any weight changes."""

    old: list[torch.Tensor]  # per sample (len - 1,): log p under the weights that sampled
    ref: list[torch.Tensor] | None  # per sample: log p under the reference (KL only)
    kept: torch.Tensor  # (N,) trained tokens per sample


class _Totals:
    """Sums over kept tokens (and optimizer steps) that become the step's metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, name: str, value: torch.Tensor | float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value)


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    loss: LossConfig,
    optim: OptimConfig,
    rng: random.Random,
    reference: Policy | None = None,
    dp: DataParallel = SINGLE,
) -> dict[str, float]:
    """Update ``policy`` on ``samples`` as the ``loss`` and ``optim`` sections say; returns the
    update's metrics. With several ranks (``dp``) every rank passes the same samples and the
    same ``rng`` state."""
    ref = None
    budget = optim.micro_batch_tokens
    if loss.kl_coef > 0:
        if reference is None:
            raise ValueError("kl_coef > 0 needs a reference policy")
        ref = sequence_logprobs(reference, samples, budget, dp)
    kept = torch.tensor([sum(s.loss_mask[1:]) for s in samples], dtype=torch.float32)
    before = _Before(sequence_logprobs(policy, samples, budget, dp), ref, kept)
    gap_sum, gap_tokens = _sampling_gap(samples, before.old)
    totals = _Totals()
    for _ in range(optim.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for m in range(optim.mini_batches):
            rows = order[m :: optim.mini_batches]
            if rows:
                _optimizer_step(policy, optimizer, samples, rows, before, loss, optim, totals, dp)
    n_tokens = float(kept.sum()) * optim.epochs
    steps = max(1.0, totals.sums.pop("optimizer_steps", 1.0))
    values = [totals.sums.get(k, 0.0) for k in SUMMED] + [gap_sum, gap_tokens]
    *summed, gap_sum, gap_tokens = dp.all_reduce_sum(values, policy.device)
    metrics = {k: v / max(n_tokens, 1.0) for k, v in zip(SUMMED, summed, strict=True)}
    if gap_tokens:
        metrics["rollout_logprob_gap"] = gap_sum / gap_tokens
    metrics["loss"] = summed[0] / steps
    metrics["grad_norm"] = totals.sums.get("grad_norm", 0.0) / steps
    metrics["trained_tokens"] = float(kept.sum())
    return metrics


def _sampling_gap(samples: Sequence[Sample], old: list[torch.Tensor]) -> tuple[float, float]:
    """Sum and count, over this rank's trained tokens, of |trainer's logprob - engine's|.

    The trainer's logprobs (``old``) come from the weights the engine should have sampled
    with; their mean gap to the engine's is float noise when the weights reached the engine
    (bf16: about 1e-2; fp32: 1e-6) and large when they did not (a missed or partial push),
    so it is logged every step as ``rollout_logprob_gap``."""
    total, count = 0.0, 0.0
    for sample, logprobs in zip(samples, old, strict=True):
        if sample.sampled_logprobs is None or logprobs.numel() == 0:  # another rank's sample
            continue
        sampled = torch.tensor(sample.sampled_logprobs[1:], dtype=torch.float32)
        mask = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)
        total += float((logprobs.cpu() - sampled).abs()[mask].sum())
        count += float(mask.sum())
    return total, count


def _optimizer_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    rows: list[int],
    before: _Before,
    loss_config: LossConfig,
    optim: OptimConfig,
    totals: _Totals,
    dp: DataParallel,
) -> None:
    # (N,) over the whole mini-batch, on every rank: the weights do not depend on the sharding.
    scales = sequence_scales(before.kept[rows], loss_config.aggregation)
    scale_of = dict(zip(rows, scales.tolist(), strict=True))
    optimizer.zero_grad(set_to_none=True)
    loss_total = 0.0
    for batch in micro_batches(policy, samples, rows, optim.micro_batch_tokens, dp):
        old_lp = _pad_rows(before.old, batch)  # (B, T)
        scale = torch.tensor(
            [scale_of[i] for i in batch.rows] or [0.0], device=policy.device
        )  # (B,); an empty batch's one row weighs 0
        weights = batch.mask * scale.unsqueeze(-1)  # (B, T)
        logprobs, logits = forward(policy, batch)  # (B, T), (B, T, V)
        pg = clipped_policy_loss(logprobs, old_lp, batch.advantages, loss_config.clip)
        token_loss = pg.loss  # (B, T)
        if before.ref is not None:
            ref_lp = _pad_rows(before.ref, batch)  # (B, T)
            token_loss = token_loss + loss_config.kl_coef * k3_kl(logprobs, ref_lp)
        if loss_config.entropy_coef > 0:
            token_loss = token_loss - loss_config.entropy_coef * entropy_from_logits(logits)
        loss = (token_loss * weights).sum()
        loss.backward()
        loss_total += loss.item()
        with torch.no_grad():
            mask = batch.mask
            totals.add("clip_frac", (pg.clipped.float() * mask).sum())
            totals.add("approx_kl", (approx_kl(logprobs, old_lp) * mask).sum())
            totals.add("entropy", (entropy_from_logits(logits.detach()) * mask).sum())
            totals.add("ratio_mean", (pg.ratio * mask).sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), optim.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # sharded parameters: a DTensor, the same on all ranks
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    totals.add("loss", loss_total)
    totals.add("grad_norm", grad_norm)
    totals.add("optimizer_steps", 1.0)
