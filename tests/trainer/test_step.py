"""step.py between the rollouts and the update: RoC keeps G of each group of 2G, and the
advantages are normalised over the kept G, not over all 2G; only kept rollouts become samples."""

from __future__ import annotations

import random
import statistics

import pytest

from trainer.config import TrainConfig, load_config
from trainer.rollout import Rollout
from trainer.step import Scored, select, to_samples


def scored(reward: float, tag: int, errors: int = 0) -> Scored:
    """A finished rollout whose ids say which one it is: prompt [tag], response [tag, 7, tag]
    with the middle token a tool token."""
    rollout = Rollout(
        prompt_ids=[tag],
        response_ids=[tag, 7, tag],
        loss_mask=[1, 0, 1],
        logprobs=[-0.5, 0.0, -0.25],
        model_turns=["<answer>\\boxed{1}</answer>"],
        turns=2,
        tool_calls=2,
        tool_errors=errors,
        finish="eos",
    )
    return Scored(rollout, reward)


def config(roc: bool = True) -> TrainConfig:
    return load_config(None, {"rollout": {"group_size": 4, "oversample": 2}, "roc.enabled": roc})


def test_advantages_are_normalised_over_the_kept_group() -> None:
    # 2G = 8: six right, two wrong. RoC keeps G = 4 with the same success rate: 3 right, 1 wrong.
    group = [scored(1.0, tag=i) for i in range(6)] + [scored(0.0, tag=10 + i) for i in range(2)]
    kept, metrics = select([group], config(), random.Random(0))
    assert [len(g) for g in kept] == [4] and metrics["roc_kept"] == 4
    assert sorted(s.reward for s in kept[0]) == [0.0, 1.0, 1.0, 1.0]
    samples = to_samples(kept)
    # Over the kept four: mean 0.75, unbiased std 0.5. Over all eight it would be 0.54 / -1.62.
    by_reward = {s.reward: a.advantage for s, a in zip(kept[0], samples, strict=True)}
    assert by_reward[1.0] == pytest.approx(0.5, abs=1e-5)
    assert by_reward[0.0] == pytest.approx(-1.5, abs=1e-5)
    assert sum(a.advantage for a in samples) == pytest.approx(0.0, abs=1e-5)


def test_samples_carry_each_kept_rollouts_own_tokens_and_masks() -> None:
    group = [scored(1.0, tag=1), scored(0.0, tag=2), scored(1.0, tag=3), scored(0.0, tag=4)]
    kept, _ = select([group], config(roc=False), random.Random(0))
    samples = to_samples(kept, sampled_logprobs=True)
    assert [s.token_ids for s in samples] == [[t, t, 7, t] for t in (1, 2, 3, 4)]
    assert all(s.loss_mask == [0, 1, 0, 1] for s in samples)  # prompt and tool tokens masked
    assert all(s.sampled_logprobs == [0.0, -0.5, 0.0, -0.25] for s in samples)
    assert to_samples(kept)[0].sampled_logprobs is None
    std = statistics.stdev([1.0, 0.0, 1.0, 0.0])
    assert [s.advantage for s in samples] == pytest.approx([0.5 / std, -0.5 / std] * 2, abs=1e-5)


def test_groups_without_contrast_give_no_samples() -> None:
    solved = [scored(1.0, tag=i) for i in range(8)]
    mixed = [scored(float(i % 2), tag=20 + i) for i in range(8)]
    kept, metrics = select([solved, mixed], config(), random.Random(0))
    assert metrics["roc_groups_dropped"] == 1
    assert [s.token_ids[0] for s in to_samples(kept)] == [s.rollout.prompt_ids[0] for s in kept[0]]
    assert all(s.token_ids[0] >= 20 for s in to_samples(kept))


def test_roc_off_keeps_g_of_2g_at_random_and_normalises_over_them() -> None:
    # The control "2G sampled, G kept uniformly at random": as many rollouts as RoC keeps.
    group = [scored(1.0, tag=i) for i in range(6)] + [scored(0.0, tag=10 + i) for i in range(2)]
    seen = set()
    for seed in range(30):
        kept, metrics = select([group], config(roc=False), random.Random(seed))
        assert [len(g) for g in kept] == [4] and metrics["roc_kept"] == 4
        seen.add(tuple(sorted(s.rollout.prompt_ids[0] for s in kept[0])))
        rewards = [s.reward for s in kept[0]]
        advantages = [a.advantage for a in to_samples(kept)]
        mean, std = statistics.mean(rewards), statistics.stdev(rewards)
        # (four drawn all right: no contrast left, every advantage 0)
        expected = [(r - mean) / std if std else 0.0 for r in rewards]
        assert advantages == pytest.approx(expected, abs=1e-4)
    assert len(seen) > 5  # drawn, not chosen


def test_grpo_control_keeps_all_g_sampled() -> None:
    # RoC off with oversample 1: G sampled, G kept, GRPO.
    grpo = load_config(None, {"rollout": {"group_size": 4, "oversample": 1}, "roc.enabled": False})
    group = [scored(1.0, tag=1), scored(0.0, tag=2), scored(1.0, tag=3), scored(0.0, tag=4)]
    kept, _ = select([group], grpo, random.Random(0))
    assert [s.rollout.prompt_ids[0] for s in kept[0]] == [1, 2, 3, 4]


def test_roc_prefers_the_clean_positives() -> None:
    # Two clean right answers, two right after two tool errors in two calls; four wrong. G = 4
    # keeps two positives: with p_total 0 vs 1, the clean ones nearly always.
    clean = [scored(1.0, tag=i) for i in range(2)]
    messy = [scored(1.0, tag=10 + i, errors=2) for i in range(2)]
    wrong = [scored(0.0, tag=20 + i) for i in range(4)]
    rng = random.Random(0)
    picks = [select([clean + messy + wrong], config(), rng)[0][0] for _ in range(200)]
    kept_tags = [sorted(s.rollout.prompt_ids[0] for s in g if s.reward) for g in picks]
    assert sum(tags == [0, 1] for tags in kept_tags) > 190
