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

The release's variant (``variant="release"``) is rStar's ``rstar2_agent/down_sample/roc.py``
at commit ecbfb94 (the file last changed in 5e95b19, "rm sort for negative samples (#50)"):
deterministic, positives sorted by penalty (lowest first, ties in generation order), negatives
taken in generation order, with per-class minimum counts (2 and 2 in its run script). Its
penalties are the release's, computed on the decoded response (tool turns included), which
differ from the ``sample`` variant's counts: turns are the ``<|im_start|>assistant ...
<|im_end|>`` spans of the response, so a rollout's first turn, whose opening is in the prompt,
is not one (a one-turn answer has p_format 1); a tool error is a ``<tool_response>`` block
containing "error" in any case (a malformed call's "Failed to decode tool call" is not one,
a printed "error" is); ``<answer>`` tags are counted in tool output too.

Minimum counts (``min_positives``, ``min_negatives``) apply to both variants; ``min_penalty``
to ``sample`` only (the release sorts, it never divides).
"""

from __future__ import annotations

import math
import random
import re
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
    response_text: str = ""  # the decoded response, tool turns included (the release's scores)


def p_err(sample: RocSample) -> float:
    if sample.tool_calls == 0:
        return 0.5
    return sample.tool_errors / sample.tool_calls


def p_format(sample: RocSample) -> float:
    if sample.answers == 0 or not sample.answer_tags_balanced or sample.turns == 0:
        return 1.0
    return min(1.0, (sample.answers - 1) / sample.turns)


RESPONSE_BLOCK = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
ANSWER_BLOCK = re.compile(r"<answer>.*?</answer>", re.DOTALL)
ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


def release_p_err(response_text: str) -> float:
    """The release's ``error_ratio``: the share of ``<tool_response>`` blocks that contain
    "error" (any case); 0.5 without one."""
    blocks = RESPONSE_BLOCK.findall(response_text)
    if not blocks:
        return 0.5
    return sum("error" in block.lower() for block in blocks) / len(blocks)


def release_p_format(response_text: str) -> float:
    """The release's ``answer_tag_repetition``: 1 without both tags, with unclosed tags or no
    complete assistant turn in the response; else ``min(1, (answers - 1) / turns)``."""
    if "<answer>" not in response_text or "</answer>" not in response_text:
        return 1.0
    closed = len(ANSWER_BLOCK.findall(response_text))
    if response_text.count("<answer>") != closed or response_text.count("</answer>") != closed:
        return 1.0
    turns = len(ASSISTANT_TURN.findall(response_text))
    if turns == 0:
        return 1.0
    return min((closed - 1) / turns, 1.0)


def penalty(sample: RocSample, settings: RocConfig) -> float:
    """``p_total`` of the settings' variant, with either term switched off as they say."""
    release = settings.variant == "release"
    total = 0.0
    if settings.use_error_ratio:
        total += release_p_err(sample.response_text) if release else p_err(sample)
    if settings.use_answer_format:
        total += release_p_format(sample.response_text) if release else p_format(sample)
    return total


def class_counts(
    n_pos: int, n_neg: int, keep: int, min_pos: int = 1, min_neg: int = 1
) -> tuple[int, int]:
    """How many positives and negatives to keep: each class's share of ``keep``, rounded half
    up, at least ``min_pos`` / ``min_neg`` (or all a class has) when both classes exist, never
    more than a class has."""
    n = n_pos + n_neg
    if keep >= n:
        return n_pos, n_neg
    pos = math.floor(keep * n_pos / n + 0.5)
    if n_pos and n_neg:
        pos = min(max(pos, min(min_pos, n_pos)), keep - min(min_neg, n_neg))
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
    n_pos, n_neg = class_counts(
        len(positives), len(negatives), keep, settings.min_positives, settings.min_negatives
    )
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
    """rStar's ``resample_of_correct`` (commit ecbfb94): the positives with the lowest penalties
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


def select_uniform(
    samples: Sequence[RocSample], settings: RocConfig, keep: int, rng: random.Random
) -> list[int] | None:
    """The control with RoC off: ``keep`` of ``samples`` uniformly at random, blind to rewards
    and penalties (all of them when no more were sampled: plain GRPO); None when the group is
    dropped (all rewards equal, ``drop_equal_reward``)."""
    if settings.drop_equal_reward and len({s.reward > 0 for s in samples}) < 2:
        return None
    return sorted(rng.sample(range(len(samples)), min(keep, len(samples))))


@dataclass(frozen=True)
class RocOutcome:
    """Per input group the kept indices (None: dropped), and what RoC did, for the metrics."""

    kept: list[list[int] | None]
    metrics: dict[str, float]


def resample_on_correct(
    groups: Sequence[Sequence[RocSample]], settings: RocConfig, keep: int, rng: random.Random
) -> RocOutcome:
    """``select_group`` on each group (``keep``: G, the rollouts kept of each), or
    ``select_uniform`` when ``settings.enabled`` is false."""
    choose = select_group if settings.enabled else select_uniform
    kept = [choose(group, settings, keep, rng) for group in groups]
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
