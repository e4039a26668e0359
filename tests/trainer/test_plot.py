"""plot.py: the panels draw what metrics.jsonl says, runs overlaid, absent series left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer.plot import PANELS, draw, field, main, points, read_run, reward_gain

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def metrics_line(step: int, with_tool_time: bool = True) -> dict[str, Any]:
    line: dict[str, Any] = {
        "step": step,
        "stage": "learn",
        "reward_mean": 0.1 * step,
        "reward_kept_mean": 0.1 * step + 0.05,
        "tool_calls": 10.0 * step,
        "rollouts": 40.0,
        "tool_error_rate": 0.5 / step,
        "response_tokens_mean": 30.0 + step,
        "roc_kept": 20.0,
        "roc_groups_dropped": float(step % 2),
        "clip_frac": 0.01 * step,
        "time_rollout_s": 3.0,
        "time_update_s": 1.0,
    }
    if with_tool_time:
        line["time_tool_s"] = 0.5
    return line


def write_run(directory: Path, steps: int, with_tool_time: bool = True) -> Path:
    directory.mkdir(parents=True)
    lines = [json.dumps(metrics_line(s, with_tool_time)) for s in range(1, steps + 1)]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def panel(name: str) -> Any:
    return next(p for p in PANELS if p.name == name)


def drawn(name: str, *runs: Path) -> dict[str, tuple[list[float], list[float]]]:
    fig, ax = plt.subplots()
    draw(ax, panel(name), [read_run(r) for r in runs])
    lines = {
        str(line.get_label()): (
            np.asarray(line.get_xdata(), dtype=float).tolist(),
            np.asarray(line.get_ydata(), dtype=float).tolist(),
        )
        for line in ax.lines
    }
    plt.close(fig)
    return lines


def test_panels_show_the_logged_values(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", steps=4)
    reward = drawn("reward", run)
    assert reward["a, all rollouts"] == ([1, 2, 3, 4], pytest.approx([0.1, 0.2, 0.3, 0.4]))
    assert reward["a, kept for the update"][1] == pytest.approx([0.15, 0.25, 0.35, 0.45])
    # tool calls are per rollout: 10 * step calls over 40 rollouts
    assert drawn("tool_calls", run)["a"][1] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    times = drawn("step_time", run)
    assert times["a, generation"][1] == pytest.approx([2.5] * 4)  # rollout less tool time
    assert times["a, tool"][1] == pytest.approx([0.5] * 4)
    assert times["a, update"][1] == pytest.approx([1.0] * 4)


def test_runs_are_overlaid_and_a_series_a_run_lacks_is_left_out(tmp_path: Path) -> None:
    new = write_run(tmp_path / "new", steps=3)
    old = write_run(tmp_path / "old", steps=5, with_tool_time=False)
    times = drawn("step_time", new, old)
    assert set(times) == {
        "new, generation",
        "new, tool",
        "new, update",
        "old, generation",
        "old, update",
    }
    assert times["old, generation"][1] == pytest.approx([3.0] * 5)  # no tool time: all of it
    assert len(drawn("clip_frac", new, old)) == 2


def test_the_command_writes_every_panel_as_png(tmp_path: Path, capsys: Any) -> None:
    a = write_run(tmp_path / "a", steps=6)
    # evaluations: a line of its own before the first step, then within steps 3 and 6
    lines = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    lines[2].update(eval_pass_rate=0.5, eval_pass_at_k=0.8)
    lines[5].update(eval_pass_rate=0.7, eval_pass_at_k=0.9)
    start = {"step": 0, "stage": "learn", "eval_pass_rate": 0.2, "eval_pass_at_k": 0.4}
    (a / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in [start, *lines]) + "\n")
    assert points(read_run(a), field("eval_pass_rate")) == ([0, 3, 6], [0.2, 0.5, 0.7])
    b = write_run(tmp_path / "b", steps=6)
    main([str(a), str(b), "--output", str(tmp_path / "plots"), "--label", "roc", "--label", "off"])
    out = capsys.readouterr().out.splitlines()
    written = [line for line in out if line.endswith(".png")]
    # rewards 0.1 ... 0.6: the first and last fifth of 6 steps are one step each
    assert "| roc | 6 | 0.100 | 0.600 | +0.500 | 0.200 → 0.700 | 24 |" in out
    assert "| off | 6 | 0.100 | 0.600 | +0.500 | nan → nan | 24 |" in out
    assert sorted(Path(p).name for p in written) == sorted(
        [f"{p.name}.png" for p in PANELS] + ["curves.png"]
    )
    for path in written:
        assert Path(path).read_bytes().startswith(PNG)
    assert Path(tmp_path / "plots" / "curves.png").stat().st_size > 10_000


def test_an_empty_run_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"metrics\.jsonl: no steps"):
        read_run(tmp_path)


def test_reward_gain_compares_the_first_and_last_fifth(tmp_path: Path) -> None:
    gain = reward_gain(read_run(write_run(tmp_path / "a", steps=10)))
    # steps 1-2: 0.1, 0.2; steps 9-10: 0.9, 1.0
    assert gain["reward_first"] == pytest.approx(0.15)
    assert gain["reward_last"] == pytest.approx(0.95)
    assert gain["gain"] == pytest.approx(0.8)
    assert gain["step_seconds"] == pytest.approx(40.0)
