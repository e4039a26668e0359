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


def _ratio(a: Figure | None, b: Figure | None) -> str:
    """exec/s of ``a`` over ``b``, and in parentheses the same by CPU: executions per
    CPU-second of what each spends (client aside), which leaves out the share of a
    contended CPU each mode happened to win."""
    if a is None or b is None or not b.exec_per_s:
        return "-"
    text = f"{a.exec_per_s / b.exec_per_s:.2f}"
    cpu_a, cpu_b = total_ms(a.cpu_ms), total_ms(b.cpu_ms)
    return text + (f" ({cpu_b / cpu_a:.2f})" if cpu_a > 0 and cpu_b > 0 else "")


# (label, numerator mode, denominator mode), printed where both were measured.
RATIOS = (
    ("bare / floor", "bare", "floor"),
    ("service / floor", "service", "floor"),
    ("service / floor-light", "service", "floor-light"),
    ("service / bare", "service", "bare"),
    ("service / service-full", "service", "service-full"),
    ("redis / service", "redis", "service"),
    ("service / naive", "service", "naive"),
    ("service / code-judge", "service", "codejudge"),
    ("service-cj / code-judge", "service-cj", "codejudge"),
)


def _overhead(svc: Figure | None, bare: Figure | None, slots: int) -> str:
    if svc is None or bare is None or not svc.exec_per_s or not bare.exec_per_s:
        return "-"
    return f"{(1 / svc.exec_per_s - 1 / bare.exec_per_s) * 1000 * slots:+.2f}"


def ratio_table(figs: Sequence[Figure], slots: int) -> str:
    """The ratios per workload, then HTTP + queue over the bare slots (ms per execution per
    slot) and Redis round trips per execution."""
    by = {(f.mode, f.workload): f for f in figs}
    workloads = list(dict.fromkeys(f.workload for f in figs))
    rows = [[label, *(_ratio(by.get((a, w)), by.get((b, w))) for w in workloads)]
            for label, a, b in RATIOS]  # fmt: skip
    rows = [r for r in rows if any(c != "-" for c in r[1:])]
    rows.append(["HTTP+queue ms", *(_overhead(by.get(("service", w)), by.get(("bare", w)),
                                              slots) for w in workloads)])  # fmt: skip
    trips = [by.get(("redis", w)) for w in workloads]
    if any(t is not None and t.extra is not None for t in trips):
        cells = [f"{t.extra:.3f}" if t and t.extra is not None else "-" for t in trips]
        rows.append(["Redis trips/exec", *cells])
    lines = [f"{'exec/s ratio (by CPU)':24}" + "".join(f"{w:>16}" for w in workloads)]
    lines += [f"{r[0]:24}" + "".join(f"{c:>16}" for c in r[1:]) for r in rows]
    return "\n".join(lines)


def cpu_table(figs: Sequence[Figure]) -> str:
    """ms of CPU per execution by role, user/system; total leaves the client out."""
    used = [r for r in ROLES if any(r in f.cpu_ms for f in figs)]
    head = " ".join(f"{r:>12}" for r in used)
    lines = [f"{'workload':8} {'mode':12} {head}   total  exec/CPU-s"]
    for f in figs:
        cells = []
        for role in used:
            u, s = f.cpu_ms.get(role, (None, None))
            cells.append(f"{'-':>12}" if u is None else f"{f'{u:.2f}/{s:.2f}':>12}")
        total = total_ms(f.cpu_ms, SERVICE_ROLES)
        rate = f"{1000 / total:10.0f}" if total > 0 else f"{'-':>10}"
        lines.append(f"{f.workload:8} {f.mode:12} " + " ".join(cells) + f"   {total:5.2f}  {rate}")
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
