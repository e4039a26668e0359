"""Resample-on-Correct: from 2G rollouts of a prompt keep G, preferring clean correct ones.

As the rStar2-Agent report defines it (GRPO-RoC):

- Each rollout gets a penalty ``p_total = p_err + p_format``. ``p_err`` is the share of its
  tool calls that errored (0.5 when it made none, so tool use is neither required nor free);
  ``p_format`` is 1 with no ``<answer>``, else ``min(1, (answers - 1) / turns)``, which grows
  with repeated answers.
- Negatives (reward 0) are kept uniformly at random: their failures are signal to learn from.
- Positives are kept by sampling without replacement with probability proportional to
  ``1 / p_total``: correct rollouts that reached the answer through tool errors or messy
  formatting are less likely to be reinforced.
- Each class keeps its share of the group (``round(G * n_class / 2G)``), so the kept group
  has the original success rate; groups whose rewards are all equal carry no advantage and are
  dropped.

Where the report is silent, we choose, and say so: a rollout with ``p_total == 0`` (no errors,
one answer) would have infinite weight, so penalties are floored at ``min_penalty`` (such
rollouts then dominate, and are uniform among themselves, the limit of the report's rule); and
when both classes are present each keeps at least one rollout, so RoC never turns a group with
signal into one without.

The release's variant (``variant="release"``) follows rStar's ``rstar2_agent/down_sample/roc.py``
as of commit 5e95b19 ("rm sort for negative samples (#50)", unchanged since): deterministic,
positives sorted by penalty (lowest first, ties in generation order), negatives taken in
generation order (before that commit they were sorted by penalty too), with per-class minimum
counts (2 and 2 in its run script); it is here for comparison and reproduction.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from trainer.config import RocConfig


@dataclass(frozen=True)
class RocSample:
    """What RoC needs of one rollout; the rollout loop records it."""

    reward: float
    tool_calls: int
    tool_errors: int
    answers: int  # closed <answer>...</answer> blocks in the model's own text
    answer_tags_balanced: bool  # every <answer> has its </answer> and no stray tags
    turns: int  # assistant turns


def p_err(sample: RocSample) -> float:
    if sample.tool_calls == 0:
        return 0.5
    return sample.tool_errors / sample.tool_calls


def p_format(sample: RocSample) -> float:
    if sample.answers == 0 or not sample.answer_tags_balanced or sample.turns == 0:
        return 1.0
    return min(1.0, (sample.answers - 1) / sample.turns)


def penalty(sample: RocSample, settings: RocConfig) -> float:
    """``p_total``, with either term switched off as the settings say."""
    total = 0.0
    if settings.use_error_ratio:
        total += p_err(sample)
    if settings.use_answer_format:
        total += p_format(sample)
    return total


def class_counts(n_pos: int, n_neg: int, keep: int) -> tuple[int, int]:
    """How many positives and negatives to keep: each class's share of ``keep``, rounded half
    up, at least one of each class when both exist, never more than a class has."""
    n = n_pos + n_neg
    if keep >= n:
        return n_pos, n_neg
    pos = math.floor(keep * n_pos / n + 0.5)
    if n_pos and n_neg:
        pos = min(max(pos, 1), keep - 1)
    pos = min(pos, n_pos)
    neg = min(keep - pos, n_neg)
    return keep - neg, neg


def sample_without_replacement(weights: Sequence[float], k: int, rng: random.Random) -> list[int]:
    """``k`` distinct indices, drawn one after another each with probability proportional to its
    weight among those not yet drawn (successive sampling, as ``numpy.random.choice`` does)."""
    pool = list(range(len(weights)))
    chosen = []
    for _ in range(min(k, len(pool))):
        threshold = rng.random() * sum(weights[i] for i in pool)
        position, acc = len(pool) - 1, 0.0
        for pos, i in enumerate(pool):
            acc += weights[i]
            if threshold < acc:
                position = pos
                break
        chosen.append(pool.pop(position))
    return chosen


def select_group(
    samples: Sequence[RocSample], settings: RocConfig, keep: int, rng: random.Random
) -> list[int] | None:
    """The indices of ``samples`` to keep (``keep`` of them: G), or None when the group is
    dropped."""
    positives = [i for i, s in enumerate(samples) if s.reward > 0]
    negatives = [i for i, s in enumerate(samples) if s.reward <= 0]
    if settings.drop_equal_reward and (not positives or not negatives):
        return None
    if settings.variant == "release":
        return _select_release(samples, positives, negatives, settings, keep)
    n_pos, n_neg = class_counts(len(positives), len(negatives), keep)
    weights = [1.0 / max(penalty(samples[i], settings), settings.min_penalty) for i in positives]
    kept_pos = [positives[j] for j in sample_without_replacement(weights, n_pos, rng)]
    kept_neg = rng.sample(negatives, n_neg)
    return sorted(kept_pos + kept_neg)


def _select_release(
    samples: Sequence[RocSample],
    positives: list[int],
    negatives: list[int],
    settings: RocConfig,
    keep: int,
) -> list[int] | None:
    """rStar's ``resample_of_correct`` (commit 5e95b19): the positives with the lowest penalties
    and the first negatives in generation order, with minimums."""
    n = len(samples)
    if n < keep:
        return None  # the release skips groups smaller than the target
    if n == keep:
        return list(range(n))
    by_penalty = sorted(positives, key=lambda i: penalty(samples[i], settings))  # stable
    n_neg = round(len(negatives) * keep / n)  # Python's round, as the release
    n_pos = round(len(positives) * keep / n)
    if n_neg < settings.min_negatives and n_pos < settings.min_positives:
        return list(range(n))
    if n_neg <= min(settings.min_negatives, len(negatives)):
        n_neg = min(settings.min_negatives, len(negatives))
        n_pos = keep - n_neg
    if n_pos <= min(settings.min_positives, len(positives)):
        n_pos = min(settings.min_positives, len(positives))
    n_neg = keep - n_pos
    return sorted(by_penalty[:n_pos] + negatives[:n_neg])  # negatives: generation order


@dataclass(frozen=True)
class RocOutcome:
    """Per input group the kept indices (None: dropped), and what RoC did, for the metrics."""

    kept: list[list[int] | None]
    metrics: dict[str, float]


def resample_on_correct(
    groups: Sequence[Sequence[RocSample]], settings: RocConfig, keep: int, rng: random.Random
) -> RocOutcome:
    """``select_group`` on each group (``keep``: G, the rollouts kept of each); ``settings``:
    the ``roc`` section (``enabled`` is the caller's)."""
    kept = [select_group(group, settings, keep, rng) for group in groups]
    positives = [s for g in groups for s in g if s.reward > 0]
    kept_samples = [g[i] for g, k in zip(groups, kept, strict=True) if k for i in k]
    kept_positives = [s for s in kept_samples if s.reward > 0]

    def mean_penalty(xs: list[RocSample]) -> float:
        return sum(penalty(s, settings) for s in xs) / len(xs) if xs else 0.0

    metrics = {
        "roc_kept": float(len(kept_samples)),
        "roc_groups_dropped": float(sum(k is None for k in kept)),
        "roc_kept_positive_frac": len(kept_positives) / len(kept_samples) if kept_samples else 0.0,
        "roc_penalty_positive_all": mean_penalty(positives),
        "roc_penalty_positive_kept": mean_penalty(kept_positives),
    }
    return RocOutcome(kept=kept, metrics=metrics)
