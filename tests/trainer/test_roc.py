"""roc.py: the penalties, the per-class counts, and that positives are drawn by 1/p_total."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from trainer.chat import EOS, tool_turn_text
from trainer.config import RocConfig
from trainer.roc import (
    RocSample,
    class_counts,
    p_err,
    p_format,
    penalty,
    release_p_err,
    release_p_format,
    resample_on_correct,
    select_group,
    select_uniform,
)
from trainer.tools import format_tool_call


def sample(
    reward: float, calls: int = 2, errors: int = 0, answers: int = 1, turns: int = 3
) -> RocSample:
    return RocSample(reward, calls, errors, answers, answer_tags_balanced=True, turns=turns)


def test_p_err() -> None:
    assert p_err(sample(1, calls=0, errors=0)) == 0.5
    assert p_err(sample(1, calls=3, errors=1)) == pytest.approx(1 / 3)
    assert p_err(sample(1, calls=4, errors=0)) == 0.0
    assert p_err(sample(1, calls=2, errors=2)) == 1.0


def test_p_format() -> None:
    assert p_format(sample(1, answers=0)) == 1.0
    assert p_format(sample(1, answers=1, turns=3)) == 0.0
    assert p_format(sample(1, answers=2, turns=4)) == 0.25
    assert p_format(sample(1, answers=5, turns=2)) == 1.0
    unbalanced = RocSample(1, 1, 0, answers=1, answer_tags_balanced=False, turns=2)
    assert p_format(unbalanced) == 1.0


def test_penalty_terms_can_be_switched_off() -> None:
    s = sample(1, calls=2, errors=1, answers=2, turns=4)  # p_err 0.5, p_format 0.25
    assert penalty(s, RocConfig()) == 0.75
    assert penalty(s, RocConfig(use_error_ratio=False)) == 0.25
    assert penalty(s, RocConfig(use_answer_format=False)) == 0.5


@pytest.mark.parametrize(
    ("n_pos", "n_neg", "keep", "expected"),
    [
        (16, 16, 16, (8, 8)),
        (5, 27, 16, (3, 13)),  # 2.5 rounds half up
        (1, 31, 16, (1, 15)),  # never lose the only positive
        (31, 1, 16, (15, 1)),  # nor the only negative
        (12, 20, 16, (6, 10)),
        (3, 2, 16, (3, 2)),  # fewer than keep: keep all
    ],
)
def test_class_counts_keep_proportions(
    n_pos: int, n_neg: int, keep: int, expected: tuple[int, int]
) -> None:
    assert class_counts(n_pos, n_neg, keep) == expected


def test_group_of_2g_becomes_g_with_the_same_success_rate() -> None:
    group = [sample(1.0) for _ in range(12)] + [sample(0.0) for _ in range(20)]
    kept = select_group(group, RocConfig(), 16, random.Random(0))
    assert kept is not None and len(kept) == len(set(kept)) == 16
    assert sum(group[i].reward > 0 for i in kept) == 6


@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_all_equal_groups_are_dropped(reward: float) -> None:
    group = [sample(reward) for _ in range(8)]
    assert select_group(group, RocConfig(), 4, random.Random(0)) is None
    kept = select_group(group, RocConfig(drop_equal_reward=False), 4, random.Random(0))
    assert kept is not None and len(kept) == 4


def test_selection_is_seeded() -> None:
    group = [sample(float(i % 3 == 0), errors=i % 2) for i in range(32)]
    runs = [select_group(group, RocConfig(), 16, random.Random(7)) for _ in range(2)]
    assert runs[0] == runs[1]
    others = {
        tuple(select_group(group, RocConfig(), 16, random.Random(s)) or ()) for s in range(10)
    }
    assert len(others) > 1


def successive_inclusion(weights: list[float], k: int) -> list[float]:
    """Exact probability that each item is among k successive weighted draws (enumeration)."""
    inclusion = [0.0] * len(weights)
    for order in itertools.permutations(range(len(weights)), k):
        p, left = 1.0, sum(weights)
        for i in order:
            p *= weights[i] / left
            left -= weights[i]
        for i in order:
            inclusion[i] += p
    return inclusion


def test_positives_are_kept_with_frequencies_of_inverse_penalty_weights() -> None:
    # Five positives with p_total 0.5, 0.75, 1.0, 1.5 and 2.0; five negatives; keep 6 of 10:
    # three positives, drawn without replacement with weights 1/p_total.
    positives = [
        sample(1.0, calls=0),  # p_err 0.5, p_format 0
        sample(1.0, calls=4, errors=1, answers=2, turns=2),  # 0.25 + 0.5
        sample(1.0, calls=0, answers=2, turns=2),  # 0.5 + 0.5
        sample(1.0, calls=2, errors=1, answers=0),  # 0.5 + 1
        sample(1.0, calls=1, errors=1, answers=0),  # 1 + 1
    ]
    settings, keep = RocConfig(), 6
    assert [penalty(s, settings) for s in positives] == [0.5, 0.75, 1.0, 1.5, 2.0]
    group = positives + [sample(0.0) for _ in range(5)]
    expected = successive_inclusion([1 / penalty(s, settings) for s in positives], 3)

    draws = 20_000
    rng = random.Random(1234)
    counts = [0] * len(group)
    for _ in range(draws):
        kept = select_group(group, settings, keep, rng)
        assert kept is not None
        for i in kept:
            counts[i] += 1
    observed = [c / draws for c in counts[:5]]
    # Binomial standard error is at most 0.0035 here; 0.015 is over four of them.
    assert observed == pytest.approx(expected, abs=0.015)
    assert observed[0] > observed[2] > observed[4]  # cleaner rollouts are kept more often
    # Negatives are uniform: each of five kept in three draws of five.
    assert [c / draws for c in counts[5:]] == pytest.approx([0.6] * 5, abs=0.015)


def test_zero_penalty_rollouts_dominate_through_the_floor() -> None:
    clean = sample(1.0, calls=2, errors=0, answers=1)  # p_total 0
    messy = sample(1.0, calls=2, errors=2, answers=0)  # p_total 2
    group = [clean, messy, sample(0.0), sample(0.0)]
    rng = random.Random(0)
    picks = [select_group(group, RocConfig(), 2, rng) for _ in range(2000)]
    assert sum(0 in (k or []) for k in picks) > 1990


def release_error_ratio(text: str) -> float:
    """rStar's ``calc_error_ratio_penalty_weights.error_ratio`` (commit ecbfb94), transcribed."""
    matches = re.findall(r"<tool_response>.*?</tool_response>", text, re.DOTALL)
    error_count = len([match for match in matches if "error" in match.lower()])
    if len(matches) == 0:
        return 0.5
    return error_count / len(matches)


def release_answer_tag_repetition(text: str) -> float:
    """rStar's ``calc_format_penalty_weights.answer_tag_repetition`` (commit ecbfb94)."""
    answer_tags = ["<answer>", "</answer>"]
    if any(ans_tag not in text for ans_tag in answer_tags):
        return 1.0
    answer_tags_count = [text.count(ans_tag) for ans_tag in answer_tags]
    closed_ans_tag_count = len(re.findall(r"<answer>.*?</answer>", text, re.DOTALL))
    if any(ans_tag_count != closed_ans_tag_count for ans_tag_count in answer_tags_count):
        return 1.0
    matches = re.findall(r"<\|im_start\|>assistant.*?<\|im_end\|>", text, re.DOTALL)
    num_turns = len(matches)
    if num_turns == 0:
        return 1.0
    return min((closed_ans_tag_count - 1) / num_turns, 1.0)


RESPONSES = (
    "Tool call success\nstdout: 42",
    "Tool call failure\nreason: timeout",
    "Tool call success\nstderr: Traceback ...\nZeroDivisionError: division by zero",
    "Failed to decode tool call: invalid JSON (Expecting value)",
    "Tool call success\nstdout: ERROR is a word",
    "Tool call success\nstdout: <answer>7</answer>",
)


def response_text(rng: random.Random, turns: int) -> str:
    """A response as the rollout loop writes one (``Rollout.response_text``): ``turns`` model
    turns, every one but the last ending in calls answered by a tool turn, answers and stray
    tags anywhere, the last turn closed by the model or not (truncated)."""
    pieces = []
    for turn in range(turns):
        model = "".join(
            rng.choice(("step ", "<answer>\\boxed{1}</answer>", "<answer>", "</answer>", ""))
            for _ in range(rng.randint(0, 3))
        )
        if turn < turns - 1:
            calls = rng.randint(1, 2)
            model += format_tool_call("print(1)") * calls
            pieces += [model, tool_turn_text([rng.choice(RESPONSES) for _ in range(calls)])]
        else:
            pieces.append(model + rng.choice((EOS, "")))
    return "".join(pieces)


def test_release_penalties_match_the_release_code() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        text = response_text(rng, rng.randint(1, 5))
        assert release_p_err(text) == release_error_ratio(text)
        assert release_p_format(text) == release_answer_tag_repetition(text)


def test_release_penalties_on_the_issues_cases() -> None:
    # One turn, no tool, one answer: no complete turn in the response (its opening is in the
    # prompt), so p_format 1; with p_err 0.5, p_total 1.5 (the report's rule: 0.5).
    one_turn = f"<answer>\\boxed{{3}}</answer>{EOS}"
    assert (release_p_err(one_turn), release_p_format(one_turn)) == (0.5, 1.0)
    both = RocConfig(variant="release")
    assert penalty(RocSample(1.0, 0, 0, 1, True, 1, one_turn), both) == 1.5
    assert penalty(sample(1.0, calls=0, answers=1, turns=1), RocConfig()) == 0.5
    # A malformed call: the response names no "error", so p_err 0 (ours: 1).
    malformed = (
        "<tool_call>{}</tool_call>"
        + tool_turn_text(["Failed to decode tool call: expected a name"])
        + f"<answer>\\boxed{{3}}</answer>{EOS}"
    )
    assert release_p_err(malformed) == 0.0
    assert release_p_format(malformed) == 0.0  # one complete turn, one answer
    # Printing the word is an error to the release; a tool turn's <answer> counts too.
    printed = "<tool_call>{}</tool_call>" + tool_turn_text(["stdout: error <answer>1</answer>"])
    assert release_p_err(printed + EOS) == 1.0
    assert release_p_format(printed + f"<answer>\\boxed{{1}}</answer>{EOS}") == 1.0  # (2-1)/1


def release_sample(reward: float, text: str) -> RocSample:
    return RocSample(reward, 0, 0, 0, True, 0, response_text=text)


def test_release_variant_takes_clean_positives_and_negatives_in_generation_order() -> None:
    # p_err 0.75, 0, 0.5, 0.25 (of four responses), as the release counts them.
    def text(errors: int) -> str:
        responses = ["Error"] * errors + ["ok"] * (4 - errors)
        return "<tool_call>{}</tool_call>" + tool_turn_text(responses) + "<answer>1</answer>" + EOS

    pens = [release_sample(1.0, text(e)) for e in (3, 0, 2, 1)]
    negs = [release_sample(0.0, text(e)) for e in (4, 0, 1, 2)]
    group = pens + negs
    settings, keep = RocConfig(variant="release", min_positives=1, min_negatives=1), 4
    kept = select_group(group, settings, keep, random.Random(0))
    # Positives with p_err 0 and 0.25; the first two negatives, not the two cleanest (5, 6):
    # rStar commit 5e95b19 removed the sort of the negatives.
    assert kept == [1, 3, 4, 5]
    assert select_group(group, settings, keep, random.Random(99)) == kept


def release_choices(
    rewards: list[float], penalties: list[float], keep: int, min_pos: int, min_neg: int
) -> list[int] | None:
    """rStar's ``resample_of_correct`` for one uid at commit ecbfb94, transcribed line by line
    (numpy and DataProto taken out); None where it keeps the whole group."""
    indices = list(range(len(rewards)))
    zero = [(i, p) for i, r, p in zip(indices, rewards, penalties, strict=True) if r <= 0]
    non_zero = [(i, p) for i, r, p in zip(indices, rewards, penalties, strict=True) if r > 0]
    non_zero.sort(key=lambda x: x[1])
    zero_num = round(len(zero) * keep / len(indices))
    non_zero_num = round(len(non_zero) * keep / len(indices))
    if zero_num < min_neg and non_zero_num < min_pos:
        return None
    if zero_num <= min(min_neg, len(zero)):
        zero_num = min(min_neg, len(zero))
        non_zero_num = keep - zero_num
    if non_zero_num <= min(min_pos, len(non_zero)):
        non_zero_num = min(min_pos, len(non_zero))
        zero_num = keep - non_zero_num
    choices = [pair[0] for pair in non_zero[:non_zero_num]] + [pair[0] for pair in zero[:zero_num]]
    assert len(choices) == keep
    return sorted(choices)


@pytest.mark.parametrize("minimum", [1, 2, 4])
def test_release_variant_matches_the_release_code_on_random_groups(minimum: int) -> None:
    rng = random.Random(5 + minimum)
    settings = RocConfig(
        variant="release", drop_equal_reward=False, min_positives=minimum, min_negatives=minimum
    )
    for _ in range(500):
        p_right = rng.choice((0.05, 0.4, 0.9))
        group = [
            release_sample(float(rng.random() < p_right), response_text(rng, rng.randint(1, 4)))
            for _ in range(32)
        ]
        penalties = [
            release_error_ratio(s.response_text) + release_answer_tag_repetition(s.response_text)
            for s in group
        ]
        expected = release_choices([s.reward for s in group], penalties, 16, minimum, minimum)
        kept = select_group(group, settings, 16, random.Random(0))
        assert kept == (expected if expected is not None else list(range(32)))


def test_release_variant_minimum_counts() -> None:
    group = [sample(1.0)] * 2 + [sample(0.0)] * 30
    settings, keep = RocConfig(variant="release", min_positives=2, min_negatives=2), 16
    kept = select_group(group, settings, keep, random.Random(0))
    assert kept is not None and len(kept) == 16
    assert sum(group[i].reward > 0 for i in kept) == 2  # round(1.0) = 1 raised to the minimum


def test_sample_variant_minimum_counts() -> None:
    # 3 positives of 32, keep 16: the share rounds to 2 (1.5 half up); a minimum of 3 keeps all.
    group = [sample(1.0)] * 3 + [sample(0.0)] * 29
    for minimum, positives in ((1, 2), (3, 3)):
        settings = RocConfig(min_positives=minimum, min_negatives=minimum)
        kept = select_group(group, settings, 16, random.Random(0))
        assert kept is not None and sum(group[i].reward > 0 for i in kept) == positives


def test_uniform_control_keeps_g_blind_to_penalties() -> None:
    # RoC off: G of 2G at random, clean or not; with exactly G sampled, all of them (GRPO).
    clean = [sample(1.0, errors=0)] * 4
    messy = [sample(1.0, errors=2, answers=0)] * 4
    group = clean + messy + [sample(0.0)] * 8
    off = RocConfig(enabled=False)
    rng = random.Random(3)
    picks = [select_uniform(group, off, 8, rng) for _ in range(4000)]
    assert all(k is not None and len(k) == len(set(k)) == 8 for k in picks)
    counts = [sum(i in (k or []) for k in picks) / len(picks) for i in range(16)]
    assert counts == pytest.approx([0.5] * 16, abs=0.04)  # messy positives as often as clean
    assert select_uniform(group[:8] + group[8:16], off, 16, rng) == list(range(16))
    assert select_uniform([sample(1.0)] * 4, off, 2, rng) is None
    outcome = resample_on_correct([group], off, 8, random.Random(0))
    assert outcome.metrics["roc_kept"] == 8


def test_resample_on_correct_reports_what_it_did() -> None:
    mixed = [sample(1.0, errors=2)] * 4 + [sample(1.0)] * 4 + [sample(0.0)] * 8
    solved = [sample(1.0)] * 16
    outcome = resample_on_correct([mixed, solved], RocConfig(), 8, random.Random(0))
    assert outcome.kept[1] is None
    assert outcome.metrics["roc_kept"] == 8
    assert outcome.metrics["roc_groups_dropped"] == 1
    assert outcome.metrics["roc_kept_positive_frac"] == 0.5
    assert (
        outcome.metrics["roc_penalty_positive_kept"] < outcome.metrics["roc_penalty_positive_all"]
    )
