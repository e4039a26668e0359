"""train.py end to end on a micro config: SFT, GRPO-RoC steps, metrics.jsonl, and a resumed run
that ends exactly where an uninterrupted one does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint import checkpoints, latest_checkpoint
from trainer.config import load_config
from trainer.problems import Problem
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
REQUIRED |= {"engines", "engine_idle_s", "tool_wait_s"}  # the rollout driver's measurements
TIMING = {"time_rollout_s", "time_tool_s", "time_update_s", "time_push_s"}
TIMING |= {"engine_idle_s", "engine_idle_frac", "tool_wait_s"}


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


def test_command_line_overrides_and_prints_the_reward_trend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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


def test_hard_stage_trains_only_on_problems_not_always_solved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(
        CONFIG,
        {
            **MICRO,
            "sft": {"enabled": False},
            "stages": [
                {"name": "toy", "steps": 1},
                {
                    "name": "hard",
                    "steps": 2,
                    "hard_only": True,
                    "hard_filter_samples": 2,
                    "hard_filter_max_problems": 4,
                },
            ],
            "checkpoint": {"every": 1, "keep": 5},
        },
    )
    seen: list[list[str]] = []

    async def fake_counts(problems: list[Problem], k: int, *args: object) -> tuple[list[int], list]:
        """The filter's rollouts, scripted: problems 0 and 2 always solved."""
        seen.append([p.id for p in problems])
        assert k == 2
        return [2, 0, 2, 1], []

    monkeypatch.setattr("trainer.train.correct_counts", fake_counts)
    history = asyncio.run(
        train(config, tmp_path, sandbox_url="subprocess", max_steps=2, progress=False)
    )
    assert [h["stage"] for h in history] == ["toy", "hard"]
    assert seen == [["toy-0", "toy-1", "toy-2", "toy-3"]]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    state = torch.load(latest / "trainer.pt", weights_only=False)["state"]
    assert (state["stage"], state["stage_step"]) == (1, 1)
    assert state["stage_problem_ids"] == [
        "toy-1",
        "toy-3",
    ]  # kept for the resumed run, not re-filtered
    rest = asyncio.run(train(config, tmp_path, sandbox_url="subprocess", progress=False))
    assert [h["stage"] for h in rest] == ["hard"] and seen == [["toy-0", "toy-1", "toy-2", "toy-3"]]


def test_evaluation_while_training_logs_avg_at_k_and_leaves_training_alone(
    tmp_path: Path,
) -> None:
    # eval.every 2 of 3 steps: before the first update (step 0), after step 2 and after the
    # last; avg@k on held-out toy problems. The run trains exactly as without evaluation.
    evaluated = load_config(
        CONFIG,
        {
            **MICRO,
            "data.eval": "toy-heldout",
            "eval": {"every": 2, "k": 2, "max_problems": 3},
            "checkpoint": {"every": 0, "keep": 1},
        },
    )
    plain = load_config(CONFIG, {**MICRO, "checkpoint": {"every": 0, "keep": 1}})
    asyncio.run(train(evaluated, tmp_path / "eval", sandbox_url="subprocess", progress=False))
    asyncio.run(train(plain, tmp_path / "plain", sandbox_url="subprocess", progress=False))
    lines = metrics(tmp_path / "eval")
    evals = [line for line in lines if "eval_pass_rate" in line]
    assert [line["step"] for line in evals] == [0, 2, 3]
    assert "reward_mean" not in evals[0] and "reward_mean" in evals[1]
    for line in evals:
        assert line["eval_k"] == 2 and line["eval_problems"] == 3
        rate, at_k = float(str(line["eval_pass_rate"])), float(str(line["eval_pass_at_k"]))
        assert 0.0 <= rate <= at_k <= 1.0
    steps = [line for line in lines if "reward_mean" in line]
    assert [line["reward_mean"] for line in steps] == [
        line["reward_mean"] for line in metrics(tmp_path / "plain")
    ]
    weights, reference = model_weights(tmp_path / "eval"), model_weights(tmp_path / "plain")
    assert all(torch.equal(weights[k], reference[k]) for k in reference)


def test_evaluation_needs_held_out_problems() -> None:
    with pytest.raises(ValueError, match=r"data\.eval"):
        load_config(CONFIG, {"eval.every": 5})


def test_the_evaluate_command_reads_data_eval_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.config import save_config
    from trainer.evaluate import main as evaluate_main
    from trainer.problems import write_problems

    held = tmp_path / "held.jsonl"
    write_problems(held, [Problem("What is 2 * 3 + 1?", "7", "a")])
    config = load_config(CONFIG, {**MICRO, "data.eval": str(held), "sft.enabled": False})
    save_config(config, tmp_path / "config.yaml")
    evaluate_main(
        ["--config", str(tmp_path / "config.yaml"), "--k", "2", "--sandbox-url", "subprocess"]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["problems"], summary["k"]) == (1.0, 2.0)
