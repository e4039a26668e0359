"""The executor benchmark's figures: rounds pooled per mode and workload, and the printed tables.

A figure pools its rounds: executions over the sum of the rounds' seconds, latencies together
(nearest-rank percentiles), CPU per execution weighted by each round's executions; the rates
of the single rounds are kept, so the noise between them shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtests.bench_modes import Measurement
from loadtests.cpu import ROLES, SERVICE_ROLES, PerExecution, total_ms


@dataclass
class Figure:
    mode: str
    workload: str
    n: int
    seconds: float
    exec_per_s: float
    p50_ms: float
    p99_ms: float
    wrong: int
    rounds: list[float]  # exec/s of each round
    cpu_ms: PerExecution  # role -> (user, system) ms per execution
    queue_p50_ms: float | None = None
    extra: float | None = None
    examples: list[str] = field(default_factory=list)


def percentile_ms(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def pool(parts: Sequence[Measurement]) -> Figure:
    """One figure of the rounds of one mode on one workload."""
    first = parts[0]
    n = sum(m.n for m in parts)
    seconds = sum(m.seconds for m in parts)
    latencies = [x for m in parts for x in m.latencies]
    waits = [x for m in parts for x in m.queue_waits]
    cpu: PerExecution = {}
    for role in ROLES:
        shares = [(m.cpu[role], m.n) for m in parts if role in m.cpu]
        if shares:
            cpu[role] = tuple(  # type: ignore[assignment]
                round(sum(c[i] * k for c, k in shares) / max(n, 1), 3) for i in (0, 1)
            )
    extras = [(m.extra, m.n) for m in parts if m.extra is not None]
    return Figure(
        mode=first.mode,
        workload=first.workload,
        n=n,
        seconds=round(seconds, 3),
        exec_per_s=round(n / seconds, 1) if seconds > 0 else 0.0,
        p50_ms=percentile_ms(latencies, 0.5),
        p99_ms=percentile_ms(latencies, 0.99),
        wrong=sum(m.wrong for m in parts),
        rounds=[round(m.n / m.seconds, 1) if m.seconds > 0 else 0.0 for m in parts],
        cpu_ms=cpu,
        queue_p50_ms=percentile_ms(waits, 0.5) if waits else None,
        extra=round(sum(e * k for e, k in extras) / max(n, 1), 3) if extras else None,
        examples=[m.example for m in parts if m.example][:3],
    )


def figures(measurements: Sequence[Measurement]) -> list[Figure]:
    """Pooled per (mode, workload), in the order each first appeared."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.mode, m.workload), []).append(m)
    return [pool(parts) for parts in groups.values()]


def throughput_table(figs: Sequence[Figure]) -> str:
    head = ("workload", "mode", "n", "exec/s", "p50 ms", "p99 ms", "wrong", "rounds exec/s")
    lines = ["{:8} {:12} {:>6} {:>8} {:>8} {:>8} {:>5}  {}".format(*head)]
    for f in figs:
        rounds = ", ".join(f"{r:.0f}" for r in f.rounds)
        lines.append(f"{f.workload:8} {f.mode:12} {f.n:6d} {f.exec_per_s:8.1f} {f.p50_ms:8.2f} "
                     f"{f.p99_ms:8.2f} {f.wrong:5d}  {rounds}")  # fmt: skip
    return "\n".join(lines)


def _ratio(a: Figure | None, b: Figure | None) -> str | None:
    if a is None or b is None or not b.exec_per_s:
        return None
    return f"{a.exec_per_s / b.exec_per_s:.2f}"


# (label, numerator mode, denominator mode), printed where both were measured.
RATIOS = (
    ("bare / floor", "bare", "floor"),
    ("service / floor", "service", "floor"),
    ("service / floor-light", "service", "floor-light"),
    ("service / bare", "service", "bare"),
    ("redis / service", "redis", "service"),
    ("service / naive", "service", "naive"),
    ("service / code-judge", "service", "codejudge"),
    ("service-cj / code-judge", "service-cj", "codejudge"),
)


def ratio_lines(figs: Sequence[Figure], slots: int) -> list[str]:
    by = {(f.mode, f.workload): f for f in figs}
    lines = []
    for workload in dict.fromkeys(f.workload for f in figs):
        parts = [f"{workload:8}"]
        for label, a, b in RATIOS:
            value = _ratio(by.get((a, workload)), by.get((b, workload)))
            if value is not None:
                parts.append(f"{label} = {value}")
        svc, bare = by.get(("service", workload)), by.get(("bare", workload))
        if svc is not None and bare is not None and svc.exec_per_s and bare.exec_per_s:
            overhead = (1 / svc.exec_per_s - 1 / bare.exec_per_s) * 1000 * slots
            parts.append(f"HTTP+queue = {overhead:+.2f} ms per execution per slot")
        redis = by.get(("redis", workload))
        if redis is not None and redis.extra is not None:
            parts.append(f"Redis round trips per execution = {redis.extra:.3f}")
        lines.append("   ".join(parts))
    return lines


def cpu_table(figs: Sequence[Figure]) -> str:
    """ms of CPU per execution by role, user/system; total leaves the client out."""
    used = [r for r in ROLES if any(r in f.cpu_ms for f in figs)]
    lines = [f"{'workload':8} {'mode':12} " + " ".join(f"{r:>12}" for r in used) + "   total"]
    for f in figs:
        cells = []
        for role in used:
            u, s = f.cpu_ms.get(role, (None, None))
            cells.append(f"{'-':>12}" if u is None else f"{f'{u:.2f}/{s:.2f}':>12}")
        total = total_ms(f.cpu_ms, SERVICE_ROLES)
        lines.append(f"{f.workload:8} {f.mode:12} " + " ".join(cells) + f"   {total:5.2f}")
    return "\n".join(lines)


def latency_table(figs: Sequence[Figure]) -> str:
    head = ("mode", "in flight", "n", "p50 ms", "p99 ms", "queue p50", "exec/s", "wrong")
    lines = ["{:16} {:>9} {:>6} {:>8} {:>8} {:>9} {:>8} {:>5}".format(*head)]
    for f in figs:
        mode, _, in_flight = f.mode.partition("@")
        queue = "-" if f.queue_p50_ms is None else f"{f.queue_p50_ms:.2f}"
        lines.append(f"{mode:16} {in_flight:>9} {f.n:6d} {f.p50_ms:8.2f} {f.p99_ms:8.2f} "
                     f"{queue:>9} {f.exec_per_s:8.1f} {f.wrong:5d}")  # fmt: skip
    return "\n".join(lines)
