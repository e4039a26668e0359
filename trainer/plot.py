"""Curves of training runs: PNGs drawn from their ``metrics.jsonl``, several runs overlaid.

    python -m trainer.plot RUN_DIR [RUN_DIR ...] [--output DIR] [--label NAME ...]

One PNG per panel (``reward.png``, ``tool_calls.png``, ...) and ``curves.png`` with every panel,
written to ``--output`` (default: the first run's ``plots/``), then a markdown table of each
run's mean reward over its first and last fifth of steps and its first and last held-out
pass rate (``eval.every``; nan without). Each run is one colour; within a
panel, line styles tell its series apart (the reward of all rollouts and of those kept for the
update; the time of generation, tool and update). A series a run did not log is left out.
Needs matplotlib (``pip install 'sandbox-service[trainer]'``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.problems import read_rows

Line = dict[str, Any]
Series = tuple[str, Callable[[Line], float | None]]  # label, value of one step (None: absent)
STYLES = ("-", "--", ":", "-.")


def field(name: str) -> Callable[[Line], float | None]:
    return lambda line: line.get(name)


def per_rollout(name: str) -> Callable[[Line], float | None]:
    return lambda line: (
        line[name] / line["rollouts"] if line.get("rollouts") and name in line else None
    )


def generation_time(line: Line) -> float | None:
    """The rollout phase less the tool's share of it (logged from ``time_tool_s`` on)."""
    if "time_rollout_s" not in line or "time_tool_s" not in line:
        return line.get("time_rollout_s")
    return line["time_rollout_s"] - line["time_tool_s"]


@dataclass(frozen=True)
class Panel:
    name: str  # the file: NAME.png
    title: str
    ylabel: str
    series: tuple[Series, ...]


PANELS = (
    Panel(
        "reward",
        "reward",
        "mean reward",
        (
            ("all rollouts", field("reward_mean")),
            ("kept for the update", field("reward_kept_mean")),
        ),
    ),
    Panel("tool_calls", "tool calls per rollout", "calls", (("", per_rollout("tool_calls")),)),
    Panel("tool_errors", "tool-error rate", "errors / calls", (("", field("tool_error_rate")),)),
    Panel(
        "response_length",
        "response length",
        "tokens (model + tool)",
        (("", field("response_tokens_mean")),),
    ),
    Panel(
        "eval",
        "held-out pass rate",
        "pass rate",
        (("avg@k", field("eval_pass_rate")), ("pass@k", field("eval_pass_at_k"))),
    ),
    Panel("roc_kept", "RoC: rollouts kept", "rollouts", (("", field("roc_kept")),)),
    Panel("roc_dropped", "RoC: groups dropped", "groups", (("", field("roc_groups_dropped")),)),
    Panel("clip_frac", "clip fraction", "tokens clipped", (("", field("clip_frac")),)),
    Panel(
        "step_time",
        "step time",
        "seconds",
        (
            ("generation", generation_time),
            ("tool", field("time_tool_s")),
            ("update", field("time_update_s")),
        ),
    ),
)


@dataclass(frozen=True)
class Run:
    label: str
    lines: list[Line]


def read_run(directory: str | Path, label: str | None = None) -> Run:
    path = Path(directory) / "metrics.jsonl"
    lines = read_rows(path)
    if not lines:
        raise ValueError(f"{path}: no steps")
    return Run(label or Path(directory).resolve().name, lines)


def reward_gain(run: Run) -> dict[str, float]:
    """Mean ``reward_mean`` of the first and of the last fifth of the steps (at least one each),
    the yardstick of ``configs/learn_cpu.yaml``, and the seconds the steps took."""
    rewards = [float(line["reward_mean"]) for line in run.lines if "reward_mean" in line]
    n = max(1, len(rewards) // 5)
    first, last = sum(rewards[:n]) / n, sum(rewards[-n:]) / n
    seconds = sum(
        line.get("time_rollout_s", 0.0) + line.get("time_update_s", 0.0) for line in run.lines
    )
    evals = [float(line["eval_pass_rate"]) for line in run.lines if "eval_pass_rate" in line]
    return {
        "steps": len(rewards),
        "reward_first": first,
        "reward_last": last,
        "gain": last - first,
        "step_seconds": seconds,
        "eval_first": evals[0] if evals else float("nan"),
        "eval_last": evals[-1] if evals else float("nan"),
    }


def points(run: Run, value: Callable[[Line], float | None]) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for line in run.lines:
        y = value(line)
        if y is not None:
            xs.append(int(line["step"]))
            ys.append(float(y))
    return xs, ys


def draw(ax: Any, panel: Panel, runs: Sequence[Run]) -> None:
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for run, colour in zip(runs, colours, strict=True):
        for (name, value), style in zip(panel.series, STYLES, strict=False):
            xs, ys = points(run, value)
            if xs:
                label = ", ".join(part for part in (run.label, name) if part)
                ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.2)
    ax.set(title=panel.title, xlabel="step", ylabel=panel.ylabel)
    ax.grid(True, alpha=0.3)
    if ax.lines and (len(runs) > 1 or len(panel.series) > 1):
        ax.legend(fontsize=7)


def plot_runs(runs: Sequence[Run], output: str | Path, dpi: int = 80) -> list[Path]:
    """Every panel as its own PNG and all of them in ``curves.png``; the paths written."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    alone = [save_panels((p,), runs, output / f"{p.name}.png", dpi, columns=1) for p in PANELS]
    return [*alone, save_panels(PANELS, runs, output / "curves.png", dpi, columns=4)]


def save_panels(
    panels: Sequence[Panel], runs: Sequence[Run], path: Path, dpi: int, columns: int
) -> Path:
    """``panels`` in a grid of ``columns``, written to ``path``; one panel gets a larger box."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(panels) // columns)
    width, height = (6.0, 3.6) if len(panels) == 1 else (4.2, 3.2)
    fig, axes = plt.subplots(
        rows, columns, figsize=(width * columns, height * rows), dpi=dpi, squeeze=False
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        draw(ax, panel, runs)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="directories with metrics.jsonl")
    parser.add_argument("--output", help="where the PNGs go (default: RUN_DIR/plots of the first)")
    parser.add_argument("--label", action="append", help="a name per run, in order (default: dir)")
    parser.add_argument("--dpi", type=int, default=80)
    args = parser.parse_args(argv)
    labels = args.label or []
    if labels and len(labels) != len(args.runs):
        parser.error(f"{len(labels)} --label for {len(args.runs)} runs")
    runs = [read_run(d, labels[i] if labels else None) for i, d in enumerate(args.runs)]
    for path in plot_runs(runs, args.output or Path(args.runs[0]) / "plots", args.dpi):
        print(path)
    print(
        "| run | steps | reward, first fifth | reward, last fifth | gain | held-out avg@k,"
        " first → last evaluation | step time (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        g = reward_gain(run)
        print(
            f"| {run.label} | {g['steps']:.0f} | {g['reward_first']:.3f} | {g['reward_last']:.3f}"
            f" | {g['gain']:+.3f} | {g['eval_first']:.3f} → {g['eval_last']:.3f}"
            f" | {g['step_seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
