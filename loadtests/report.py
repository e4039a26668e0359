"""The report of a load test: every figure as JSON, a markdown summary, and PNG plots.

Percentiles are nearest-rank: p-th percentile of n sorted values is the value at rank
ceil(p/100 * n), so it is always a latency that was actually observed, and p100 is the max.
Rates are answers over the span from the first request sent to the last answer received.

Files written into the output directory: ``report.json``, ``summary.md``, ``latency.png``
(histogram and CDF of end-to-end latency, queue wait and run time), ``throughput.png``
(answers received and executions finished per second, with the server's queue depth where
it was sampled) and
``server.png`` (the service's memory and process count over time, where it was sampled).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from loadtests.generator import Recorder, Run

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
TARGET_IN_FLIGHT = 50_000
TARGET_API_MB = 1024
TARGET_LIGHT_P99_MS = 20.0
LIGHT_LOAD = 100


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def distribution_ms(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for name, q in QUANTILES.items():
        v = percentile(ordered, q)
        out[name] = None if v is None else round(v * 1000, 3)
    out["max"] = round(ordered[-1] * 1000, 3) if ordered else None
    out["mean"] = round(sum(ordered) / len(ordered) * 1000, 3) if ordered else None
    return out


def per_second(done_at: Sequence[float]) -> list[int]:
    """Answers in each whole second since the run started."""
    if not done_at:
        return []
    counts = Counter(int(t) for t in done_at)
    return [counts.get(i, 0) for i in range(int(max(done_at)) + 1)]


def outside(r: Recorder) -> list[float]:
    """Per answer, the time from the request on the wire to its answer that neither the queue
    nor the execution accounts for: sending, parsing and admission, the answer's way back, the
    client's own scheduling; in a batch, also waiting for the rest of the batch (its answer
    comes when the last is done)."""
    parts = zip(r.latency, r.send_wait, r.queue_wait, r.run_time, strict=True)
    return [max(0.0, e2e - before - queued - ran) for e2e, before, queued, ran in parts]


def figures(run: Run) -> dict[str, Any]:
    """Every figure of one run, JSON-ready."""
    r = run.recorder
    seconds = run.seconds
    fig: dict[str, Any] = {
        "label": run.label,
        "target": run.target,
        "workload": run.workload,
        "plan": {
            "count": run.plan.count,
            "concurrency": run.plan.concurrency,
            "batch": run.plan.batch,
            "lanes": run.plan.lanes,
            "in_flight": run.plan.in_flight,
            "duration_s": run.plan.duration_s,
            "drain_s": run.plan.drain_s,
        },
        "sent": r.sent,
        "max_in_flight": r.max_outstanding,
        "unsent": run.unsent,
        "answered": r.answered,
        "lost": r.lost,
        "wrong": r.wrong,
        "statuses": dict(r.statuses.most_common()),
        "lost_reasons": dict(r.lost_reasons),
        "wrong_kinds": dict(r.wrong_kinds.most_common()),
        "service_failures": dict(r.service_failures.most_common()),
        "retries": run.retries,
        "seconds": round(seconds, 3),
        "exec_per_s": round(r.answered / seconds, 1) if seconds > 0 else None,
        "latency_ms": distribution_ms(r.latency),
        "queue_wait_ms": distribution_ms(r.queue_wait),
        "run_time_ms": distribution_ms(r.run_time),
        "send_wait_ms": distribution_ms(r.send_wait),
        "outside_ms": distribution_ms(outside(r)),
        "client_cpu_s": round(run.client_cpu_s, 2),
        "client_gc": run.client_gc,
        "client_cpu_cores": round(run.client_cpu_s / seconds, 2) if seconds > 0 else None,
        "server_cpu_s": None if run.server_cpu_s is None else round(run.server_cpu_s, 2),
        "server_cpu_cores": (
            round(run.server_cpu_s / seconds, 2) if run.server_cpu_s and seconds > 0 else None
        ),
        "throughput_per_s": per_second(r.done_at),
        "executions_finished_per_s": per_second(r.finished_at),
        "wrong_examples": r.wrong_examples,
        "notes": run.notes,
    }
    if run.watcher is not None:
        fig["server"] = run.watcher.summary()
        fig["server_samples"] = run.watcher.series()
    return fig


def ratios(primary: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    """primary / baseline for rates, baseline / primary for latencies: above 1 is better."""

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    out = {"exec_per_s": div(primary["exec_per_s"], baseline["exec_per_s"])}
    for q in ("p50", "p90", "p99"):
        out[f"latency_{q}"] = div(baseline["latency_ms"][q], primary["latency_ms"][q])
    return out


def _verdict(measured: bool, met: bool, detail: str) -> dict[str, str]:
    state = "met" if met else "MISSED"
    return {"verdict": state if measured else "not measured by this run", "detail": detail}


def targets(fig: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The issue's targets, judged on this run where its shape measures them."""
    server = fig.get("server") or {}
    in_flight = fig["max_in_flight"]
    depth = server.get("depth_max")
    deep = in_flight >= TARGET_IN_FLIGHT
    api_mb = (server.get("api_rss_mb") or {}).get("max")
    p99 = fig["latency_ms"]["p99"]
    light = fig["workload"] == "trivial" and 0 < in_flight <= LIGHT_LOAD
    return {
        "50k in flight, 0 lost, 0 wrong": _verdict(
            deep,
            deep and fig["lost"] == 0 and fig["wrong"] == 0,
            f"{in_flight} in flight at most (server's deepest queue seen: {depth}), "
            f"lost {fig['lost']}, wrong {fig['wrong']}",
        ),
        "API memory < 1 GiB at 50k deep": _verdict(
            deep and api_mb is not None,
            api_mb is not None and api_mb < TARGET_API_MB,
            f"API process RSS max {api_mb} MiB" if api_mb is not None else "not sampled",
        ),
        "p99 trivial < 20 ms at <= 100 in flight": _verdict(
            light and p99 is not None,
            p99 is not None and p99 < TARGET_LIGHT_P99_MS,
            f"p99 {p99} ms at {in_flight} in flight at most, workload {fig['workload']}",
        ),
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def table(figs: Sequence[dict[str, Any]]) -> str:
    head = ["", *(f["label"] for f in figs)]
    rows: list[list[str]] = [
        ["target", *(f["target"] for f in figs)],
        ["workload", *(f["workload"] for f in figs)],
        [
            "in flight at most (batch)",
            *(f"{f['max_in_flight']} ({f['plan']['batch']})" for f in figs),
        ],
        ["answered / sent", *(f"{f['answered']} / {f['sent']}" for f in figs)],
        ["lost", *(str(f["lost"]) for f in figs)],
        ["wrong", *(str(f["wrong"]) for f in figs)],
        ["exec/s", *(_num(f["exec_per_s"]) for f in figs)],
    ]
    for name in ("p50", "p90", "p99", "max"):
        rows.append([f"latency {name} ms", *(_ms(f["latency_ms"][name]) for f in figs)])
    rows += [
        ["queue wait p50 / p99 ms",
         *(f"{_ms(f['queue_wait_ms']['p50'])} / {_ms(f['queue_wait_ms']['p99'])}" for f in figs)],
        ["run time p50 / p99 ms",
         *(f"{_ms(f['run_time_ms']['p50'])} / {_ms(f['run_time_ms']['p99'])}" for f in figs)],
        ["before the wire p50 / p99 ms",
         *(f"{_ms(f['send_wait_ms']['p50'])} / {_ms(f['send_wait_ms']['p99'])}" for f in figs)],
        ["rest (HTTP, batch) p50 / p99 ms",
         *(f"{_ms(f['outside_ms']['p50'])} / {_ms(f['outside_ms']['p99'])}" for f in figs)],
        ["client CPU (cores)", *(_num(f["client_cpu_cores"], "{:.2f}") for f in figs)],
        ["client GC max pause ms", *(_num(f["client_gc"].get("max_ms")) for f in figs)],
        ["server CPU (cores)", *(_num(f["server_cpu_cores"], "{:.2f}") for f in figs)],
        ["statuses", *(", ".join(f"{k} {v}" for k, v in f["statuses"].items()) for f in figs)],
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


MEMORY = {
    "api_rss_mb": "API process RSS MiB",
    "zygotes_rss_mb": "zygotes RSS MiB",
    "tree_pss_mb": "whole tree PSS MiB",
}


def server_lines(fig: dict[str, Any]) -> list[str]:
    s = fig.get("server")
    if not s or not s.get("samples"):
        return []
    idle, entries = s["idle_processes"], s["scratch_entries"]
    lines = [f"- deepest queue seen (waiting + running): {s['depth_max']}"]
    for key, name in MEMORY.items():
        span = s[key]
        lines.append(f"- {name}: start {span['start']}, end {span['end']}, max {span['max']}")
    return [
        *lines,
        f"- processes in the service tree: idle before {idle.get('start')}, "
        f"idle after {idle.get('end')}, max {s['processes']['max']}; "
        f"zombies max {s['zombies_max']}",
        f"- entries under {', '.join(s['scratch_dirs']) or 'no scratch directory given'}: "
        f"before {entries.get('start')}, after {entries.get('end')}",
    ]


def comparable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Latencies compare only between runs of the same count at the same concurrency."""
    keys = ("count", "concurrency", "batch")
    return all(a["plan"][k] == b["plan"][k] for k in keys) and a["workload"] == b["workload"]


def comparison(a: dict[str, Any], b: dict[str, Any]) -> str:
    r = ratios(a, b)
    text = f"**{a['label']} / {b['label']}**: {_num(r['exec_per_s'], '{:.2f}')}× the exec/s"
    if comparable(a, b):
        text += (f"; latency p50 {_num(r['latency_p50'], '{:.2f}')}× and p99 "
                 f"{_num(r['latency_p99'], '{:.2f}')}× lower")  # fmt: skip
    else:
        text += "; latencies not compared (the runs differ in count, concurrency or batch)"
    return text + " (one run after the other, never overlapping)."


def markdown(figs: Sequence[dict[str, Any]], title: str) -> str:
    out = [f"# {title}", "", table(figs), ""]
    if len(figs) == 2:
        out += [comparison(figs[0], figs[1]), ""]
    for fig in figs:
        lines = server_lines(fig)
        if lines:
            out += [f"## Service ({fig['label']})", "", *lines, ""]
        if fig["lost_reasons"]:
            out += [f"Lost ({fig['label']}): {fig['lost_reasons']}", ""]
        if fig["wrong_kinds"]:
            out += [f"Wrong by kind ({fig['label']}): {fig['wrong_kinds']}", ""]
        if fig["service_failures"]:
            out += [f"Service failures ({fig['label']}): {fig['service_failures']}", ""]
        if fig["retries"]:
            out += [f"Retries ({fig['label']}): {fig['retries']}", ""]
    out += ["## Targets", ""]
    for name, v in targets(figs[0]).items():
        out.append(f"- {name}: **{v['verdict']}** ({v['detail']})")
    return "\n".join(out) + "\n"


def write(
    out_dir: str,
    figs: Sequence[dict[str, Any]],
    title: str,
    meta: dict[str, Any],
    runs: Sequence[Run],
    plots: bool = True,
) -> list[str]:
    """Write report.json, summary.md and (if matplotlib is there) the plots; return paths."""
    os.makedirs(out_dir, exist_ok=True)
    data: dict[str, Any] = {"title": title, **meta, "runs": list(figs)}
    if len(figs) == 2:
        data["ratios"] = ratios(figs[0], figs[1])
    data["targets"] = targets(figs[0])
    paths = [os.path.join(out_dir, "report.json"), os.path.join(out_dir, "summary.md")]
    with open(paths[0], "w") as f:
        json.dump(data, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(markdown(figs, title))
    if plots:
        from loadtests import plots as plotting

        paths += plotting.draw(out_dir, runs, figs)
    return paths
