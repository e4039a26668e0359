"""train.py end to end on a micro config: SFT, GRPO-RoC steps, metrics.jsonl, and a resumed run
that ends exactly where an uninterrupted one does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from trainer.checkpoint import checkpoints, latest_checkpoint
from trainer.config import load_config
from trainer.train import main, train

CONFIG = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "tiny_cpu.yaml"
MICRO = {
    "model.tiny": {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_layers": 1},
    "rollout": {
        "group_size": 2,
        "oversample": 2,
        "prompts_per_step": 2,
        "max_turns": 2,
        "max_response_tokens": 48,
    },
    "sft": {"enabled": True, "steps": 5, "batch_size": 4, "toy_transcripts": 16},
    "stages": [{"name": "toy", "steps": 3}],
    "checkpoint": {"every": 2, "keep": 5},
    "logging.progress": False,
}
REQUIRED = {"step", "loss", "reward_mean", "tool_calls", "tool_errors", "roc_kept", "clip_frac"}
TIMING = {"time_rollout_s", "time_update_s"}


def model_weights(output: Path) -> dict[str, torch.Tensor]:
    latest = latest_checkpoint(output)
    assert latest is not None
    return load_file(latest / "model" / "model.safetensors")


def metrics(output: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    config = load_config(CONFIG, MICRO)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    history = asyncio.run(train(config, whole, sandbox_url="subprocess", progress=False))
    assert [h["step"] for h in history] == [1, 2, 3]
    first = asyncio.run(train(config, parts, sandbox_url="subprocess", max_steps=2, progress=False))
    assert [h["step"] for h in first] == [1, 2]
    rest = asyncio.run(train(config, parts, sandbox_url="subprocess", progress=False))
    assert [h["step"] for h in rest] == [3]

    assert (whole / "sft" / "model.safetensors").exists()
    lines = metrics(whole)
    assert len(lines) == 3 and all(set(line) >= REQUIRED for line in lines)
    assert [line["step"] for line in metrics(parts)] == [1, 2, 3]
    for a, b in zip(lines, metrics(parts), strict=True):
        assert {k: v for k, v in a.items() if k not in TIMING} == {
            k: v for k, v in b.items() if k not in TIMING
        }
    w, p = model_weights(whole), model_weights(parts)
    assert w.keys() == p.keys() and all(torch.equal(w[k], p[k]) for k in w)
    assert [c.name for c in checkpoints(whole)] == ["step_000002", "step_000003"]


def test_command_line_overrides_and_prints_the_reward_trend(tmp_path: Path, capsys) -> None:
    overrides = ["--set", "stages=[{name: toy, steps: 1}]", "--set", "sft.steps=2"]
    for key, value in MICRO.items():
        if key not in ("stages", "sft"):
            overrides += ["--set", f"{key}={json.dumps(value)}"]
    main(
        [
            "--config",
            str(CONFIG),
            "--output",
            str(tmp_path),
            "--sandbox-url",
            "subprocess",
            "--no-progress",
            *overrides,
        ]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 1 and 0.0 <= summary["reward_first"] <= 1.0
    saved = load_config(tmp_path / "config.yaml")
    assert saved.sft.steps == 2 and saved.rollout.group_size == 2
