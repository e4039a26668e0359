"""tracking.py: every step's numbers reach metrics.jsonl, and TensorBoard and W&B when there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.tracking import TENSORBOARD_DIR, WANDB_ID_FILE, MetricsLog

STEPS = [
    {"step": 1, "stage": "learn", "reward_mean": 0.25, "tool_calls": 12.0, "updated": True},
    {"step": 2, "stage": "learn", "reward_mean": 0.5, "tool_calls": 20.0, "updated": True},
]


def test_without_trackers_only_the_jsonl_is_written(tmp_path: Path) -> None:
    config = load_config(None, {"logging.tensorboard": False})
    with MetricsLog(tmp_path, config) as log:
        assert log.destinations == ["metrics.jsonl"]
        for line in STEPS:
            log.write(line)
    with MetricsLog(tmp_path, config) as log:  # a resumed run appends
        log.write({"step": 3, "reward_mean": 0.75})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert lines[0] == STEPS[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_rank_that_does_not_write_leaves_nothing(tmp_path: Path) -> None:
    with MetricsLog(tmp_path, load_config(None), enabled=False) as log:
        log.write(STEPS[0])
        assert log.destinations == []
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_gets_every_number_at_its_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLog(tmp_path, load_config(None)) as log:
        assert log.destinations == ["metrics.jsonl", "tensorboard"]
        for line in STEPS:
            log.write(line)
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {
        "train/reward_mean",
        "train/tool_calls",
    }  # no text (stage), no booleans, the step is the x axis
    rewards = events.Scalars("train/reward_mean")
    assert [(e.step, e.value) for e in rewards] == [(1, 0.25), (2, 0.5)]


def test_wandb_offline_run_is_continued_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = load_config(None, {"logging.wandb_project": "tests", "logging.tensorboard": False})
    with MetricsLog(tmp_path, config) as log:
        assert log.destinations == ["metrics.jsonl", "wandb"]
        for line in STEPS:
            log.write(line)
        assert log.wandb.summary["train/reward_mean"] == 0.5
        assert log.wandb.config["rollout"]["group_size"] == config.rollout.group_size
        first_id = log.wandb.id
    assert (tmp_path / WANDB_ID_FILE).read_text() == first_id
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{first_id}/run-{first_id}.wandb"))
    with MetricsLog(tmp_path, config) as log:
        assert log.wandb.id == first_id


def test_wandb_needs_a_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with MetricsLog(tmp_path, load_config(None, {"logging.tensorboard": False})) as log:
        assert log.wandb is None
