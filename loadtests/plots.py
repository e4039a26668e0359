"""PNG plots of a load test (matplotlib, drawn off-screen): latency, throughput, the service.

Latency is split as the service reports it: queue wait (queued until a slot took it), run
time (the execution's wall time), and end to end as the client saw it (which adds HTTP,
batching and the client's own scheduling).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from loadtests.generator import Run

FLOOR_MS = 1e-3  # log axes: a zero queue wait is drawn at 1 µs
SIZE = (10, 4)
MAX_POINTS = 120  # a longer throughput series is drawn as means over windows
DPI = 80


def _ms(values: Sequence[float]) -> np.ndarray:
    return np.maximum(np.asarray(values, dtype=float) * 1000, FLOOR_MS)


def _cdf(ax: Any, values: np.ndarray, label: str, style: str = "-") -> None:
    if values.size:
        ordered = np.sort(values)
        ax.plot(ordered, np.arange(1, ordered.size + 1) / ordered.size, style, label=label)


def latency(path: str, runs: Sequence[Run]) -> None:
    main = runs[0].recorder
    parts = {
        "end to end": _ms(main.latency),
        "queue wait": _ms(main.queue_wait),
        "run time": _ms(main.run_time),
    }
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    every = np.concatenate([v for v in parts.values() if v.size] or [np.array([1.0])])
    bins = np.logspace(np.log10(every.min()), np.log10(every.max() * 1.01), 60)
    for name, values in parts.items():
        if values.size:
            hist.hist(values, bins=bins, histtype="step", label=name)
            _cdf(cdf, values, f"{runs[0].label}: {name}")
    for other in runs[1:]:
        _cdf(cdf, _ms(other.recorder.latency), f"{other.label}: end to end", "--")
    hist.set(xscale="log", xlabel="ms", ylabel="executions", title=f"{runs[0].label} latency")
    cdf.set(xscale="log", xlabel="ms", ylabel="fraction answered within", title="CDF")
    cdf.grid(True, which="both", alpha=0.3)
    hist.legend(fontsize=8)
    cdf.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def smooth(series: Sequence[int], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Means over consecutive windows of ``window`` seconds, placed at their middles."""
    values = np.asarray(series, dtype=float)
    whole = values.size // window * window
    if window == 1 or whole == 0:
        return np.arange(values.size), values
    means = values[:whole].reshape(-1, window).mean(axis=1)
    return np.arange(means.size) * window + window / 2, means


def throughput(path: str, figs: Sequence[dict[str, Any]]) -> None:
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for f in figs:
        answers, finished = f["throughput_per_s"], f["executions_finished_per_s"]
        window = max(1, len(answers) // MAX_POINTS)
        note = f", {window} s mean" if window > 1 else ""
        if f["plan"]["batch"] == 1:
            ax.plot(*smooth(answers, window), label=f"{f['label']} answers/s{note}")
            continue
        # A batch's answers arrive at once, in spikes; when each execution finished is the
        # steadier line (estimated from its queue wait and run time).
        line = ax.plot(
            *smooth(finished, window), label=f"{f['label']} executions finished/s (estimated){note}"
        )
        ax.plot(*smooth(answers, window), color=line[0].get_color(), alpha=0.3, linewidth=0.6,
                label=f"{f['label']} answers received/s{note}")  # fmt: skip
    ax.set(xlabel="seconds since start", ylabel="per second", title="Throughput")
    samples = [s for s in figs[0].get("server_samples", []) if s["waiting"] is not None]
    if samples:
        depth = ax.twinx()
        depth.plot(
            [s["t"] for s in samples],
            [s["waiting"] + s["running"] for s in samples],
            color="grey",
            linestyle=":",
            label=f"{figs[0]['label']} queue depth",
        )
        depth.set_ylabel("queued + running")
        depth.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _with_processes(ax: Any, t: list[float], samples: Sequence[dict[str, Any]], label: str) -> None:
    """The process count on a second axis of a memory plot, and both legends."""
    procs = ax.twinx()
    procs.plot(t, [s["processes"] for s in samples], color="grey", linestyle=":", label=label)
    procs.set_ylabel("processes")
    procs.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    procs.legend(loc="upper right", fontsize=8)


def server(path: str, fig_data: dict[str, Any]) -> None:
    samples = fig_data["server_samples"]
    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ax.plot(t, [s["api_rss_mb"] for s in samples], label="API process RSS")
    ax.plot(t, [s["zygotes_rss_mb"] for s in samples], label="zygotes RSS")
    ax.plot(t, [s["tree_pss_mb"] for s in samples], label="whole tree PSS", alpha=0.6)
    ax.set(xlabel="seconds since start", ylabel="MiB", title=f"Service ({fig_data['label']})")
    ax.set_ylim(bottom=0)
    _with_processes(ax, t, samples, "processes in tree")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def faults(path: str, fig_data: dict[str, Any], events: Sequence[dict[str, Any]]) -> None:
    """The fault soak: executions finished per second, each fault a vertical line, and the
    deployment's memory and process count below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(SIZE[0], SIZE[1] * 1.6), dpi=DPI,
                                      sharex=True)  # fmt: skip
    finished = fig_data["executions_finished_per_s"]
    top.plot(np.arange(len(finished)), finished, label="executions finished/s (estimated)")
    colors = dict(zip(("zygote", "worker", "api", "redis"), ("C1", "C2", "C3", "C4"), strict=True))
    for kind, color in colors.items():
        times = [e["at_s"] for e in events if e["kind"] == kind]
        for n, t in enumerate(times):
            top.axvline(
                t, color=color, alpha=0.6, linewidth=1, label=f"kill {kind}" if not n else None
            )
    top.set(ylabel="per second", title="Fault soak: throughput while parts are killed")
    top.legend(loc="upper right", fontsize=8)
    samples = fig_data.get("server_samples", [])
    t = [s["t"] for s in samples]
    bottom.plot(t, [s["tree_pss_mb"] for s in samples], label="all nodes' trees PSS")
    bottom.set(xlabel="seconds since start", ylabel="MiB")
    bottom.set_ylim(bottom=0)
    _with_processes(bottom, t, samples, "processes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw(out_dir: str, runs: Sequence[Run], figs: Sequence[dict[str, Any]]) -> list[str]:
    paths = [os.path.join(out_dir, "latency.png"), os.path.join(out_dir, "throughput.png")]
    latency(paths[0], runs)
    throughput(paths[1], figs)
    if figs[0].get("server_samples"):
        paths.append(os.path.join(out_dir, "server.png"))
        server(paths[2], figs[0])
    return paths
