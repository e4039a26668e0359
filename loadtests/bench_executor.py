"""Executor benchmark: the service against the bare executor and a naive baseline, in one run.

    python -m loadtests.bench_executor [--n 2000] [--batch 64] [--quick] [--modes ...]

For each workload (trivial print, sympy factor, numpy) it measures, one after another so they
do not share the CPU:

- ``bare``: the slots driven directly, no HTTP and no queue (the executor's own ceiling);
- ``service``: the embedded service over HTTP, batches of ``--batch``, every isolation layer
  the host allows on;
- ``redis``: the same through Redis mode: 1 API node and 2 worker nodes sharing the slots
  (half each) on a throwaway ``redis-server``, with the Redis round trips per execution that
  all three nodes made;
- ``naive``: one ``subprocess.run([python, "-c", code])`` per call, as code-judge runs code,
  with as many in parallel as there are CPUs;

and prints exec/s, p50/p99 latency, the service/naive ratio and the per-execution overhead
of HTTP + queue over the bare executor. Figures from one run on a shared machine are noisy:
compare ratios, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import httpx

from loadtests.cluster import Cluster
from sandbox_service.client import AsyncSandboxClient
from sandbox_service.executor.pool import SlotPool
from sandbox_service.launch import ServiceProcess, launch
from sandbox_service.models import ExecuteRequest, Status
from sandbox_service.settings import Settings

MODES = ("bare", "service", "redis", "naive")
WORKLOADS = {
    "trivial": ("print(sum(range(1000)))", "499500\n"),
    "sympy": (
        "import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**6 - 1))",
        "(x - 1)*(x + 1)*(x**2 - x + 1)*(x**2 + x + 1)\n",
    ),
    "numpy": (
        "import numpy as np\na = np.arange(12.0).reshape(3, 4)\nprint(float((a @ a.T).trace()))",
        "506.0\n",
    ),
}


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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _figure(mode: str, workload: str, latencies: list[float], seconds: float, wrong: int) -> Figure:
    n = len(latencies)
    return Figure(mode, workload, n, round(seconds, 3), round(n / seconds, 1),
                  round(_percentile(latencies, 0.5), 2), round(_percentile(latencies, 0.99), 2),
                  wrong)  # fmt: skip


async def bench_bare(settings: Settings, workload: str, n: int) -> Figure:
    """The slots alone: each slot runs jobs back to back, nothing in between."""
    code, expected = WORKLOADS[workload]
    pool = SlotPool(settings)
    await pool.start()
    request = {"code": code, "stdin": "", "mode": "script", "files": {}, "timeout_s": 30,
               "memory_mb": 1024}  # fmt: skip
    latencies: list[float] = []
    wrong = 0
    todo = iter(range(n))

    async def drive(slot) -> None:  # type: ignore[no-untyped-def]
        nonlocal wrong
        for _ in todo:
            t = time.perf_counter()
            out = await slot.execute(request)
            latencies.append(time.perf_counter() - t)
            wrong += out["stdout"] != expected

    await asyncio.gather(*(drive(s) for s in pool.slots[:1]))  # warm both caches and pages
    latencies.clear()
    wrong = 0
    todo = iter(range(n))
    start = time.perf_counter()
    await asyncio.gather(*(drive(s) for s in pool.slots))
    seconds = time.perf_counter() - start
    await pool.stop()
    return _figure("bare", workload, latencies, seconds, wrong)


async def bench_service(
    url: str,
    workload: str,
    n: int,
    batch: int,
    mode: str = "service",
    warm: Callable[[], None] | None = None,
) -> Figure:
    """Batches of ``batch``, four in flight; ``warm`` is called after the warm-up batch."""
    code, expected = WORKLOADS[workload]
    latencies: list[float] = []
    async with AsyncSandboxClient(url, batch_size=batch, concurrency=4) as client:
        await client.execute_batch([code] * batch)  # warm-up
        if warm is not None:
            warm()

        async def one_batch(size: int) -> list:  # type: ignore[type-arg]
            t = time.perf_counter()
            results = await client._run_chunk([ExecuteRequest(code=code)] * size)
            latencies.extend([time.perf_counter() - t] * size)
            return results

        sizes = [batch] * (n // batch) + ([n % batch] if n % batch else [])
        gate = asyncio.Semaphore(4)

        async def gated(size: int) -> list:  # type: ignore[type-arg]
            async with gate:
                return await one_batch(size)

        start = time.perf_counter()
        chunks = await asyncio.gather(*(gated(s) for s in sizes))
        seconds = time.perf_counter() - start
    results = [r for chunk in chunks for r in chunk]
    wrong = sum(r.status is not Status.ok or r.stdout != expected for r in results)
    return _figure(mode, workload, latencies, seconds, wrong)


def _round_trips(nodes: list[ServiceProcess]) -> float:
    """Redis round trips all ``nodes`` made so far, from their /metrics."""
    total = 0.0
    for node in nodes:
        for line in httpx.get(f"{node.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("sandbox_redis_round_trips_total "):
                total += float(line.split()[1])
    return total


def redis_mode(settings: Settings, logs: str) -> Cluster:
    """1 API node and 2 worker nodes (half the slots each) on a throwaway redis-server."""
    return Cluster(logs, api_nodes=1, workers=2, slots=max(1, settings.slots // 2))


def bench_redis(cluster: Cluster, workload: str, n: int, batch: int) -> tuple[Figure, float]:
    """One workload through Redis mode; (figure, Redis round trips per execution)."""
    nodes = [node.process for node in cluster.nodes if node.process is not None]
    before = [0.0]

    def warm() -> None:
        before[0] = _round_trips(nodes)

    figure = asyncio.run(bench_service(nodes[0].url, workload, n, batch, "redis", warm))
    return figure, (_round_trips(nodes) - before[0]) / n


async def bench_service_latency(url: str, n: int, mode: str = "service-single") -> Figure:
    """Single requests, one at a time: the latency a lone tool call sees under no load."""
    code, expected = WORKLOADS["trivial"]
    latencies = []
    wrong = 0
    async with AsyncSandboxClient(url, batch_size=1) as client:
        await client.execute(code)
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            r = await client.execute(code)
            latencies.append(time.perf_counter() - t)
            wrong += r.stdout != expected
        seconds = time.perf_counter() - start
    return _figure(mode, "trivial", latencies, seconds, wrong)


def bench_naive(workload: str, n: int, parallel: int) -> Figure:
    code, expected = WORKLOADS[workload]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1"}

    def one(_: int) -> tuple[float, bool]:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, env=env)  # fmt: skip
        return time.perf_counter() - t, out.stdout == expected

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(one, range(n)))
    seconds = time.perf_counter() - start
    return _figure("naive", workload, [d[0] for d in done], seconds, sum(not d[1] for d in done))


def _table(figures: list[Figure]) -> str:
    head = ("workload", "mode", "n", "exec/s", "p50 ms", "p99 ms", "wrong")
    lines = ["{:8} {:15} {:>6} {:>9} {:>8} {:>8} {:>5}".format(*head)]
    for f in figures:
        lines.append(f"{f.workload:8} {f.mode:15} {f.n:6d} {f.exec_per_s:9.1f} {f.p50_ms:8.2f} "
                     f"{f.p99_ms:8.2f} {f.wrong:5d}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="executions per trivial workload")
    parser.add_argument("--batch", type=int, default=64, help="requests per HTTP batch")
    parser.add_argument("--quick", action="store_true", help="a small run (CI smoke)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"which to measure, of {','.join(MODES)} (service is always measured)",
    )
    args = parser.parse_args(argv)
    modes = {m.strip() for m in args.modes.split(",")} | {"service"}
    n = 200 if args.quick else args.n
    settings = Settings()
    parallel = os.cpu_count() or 1
    sizes = {"trivial": n, "sympy": max(n // 4, 50), "numpy": max(n // 2, 50)}
    naive_sizes = {"trivial": max(n // 10, 20), "sympy": 10 if args.quick else 30,
                   "numpy": max(n // 40, 20)}  # fmt: skip
    figures: list[Figure] = []
    trips: dict[str, float] = {}
    print(f"slots={settings.slots} cpus={parallel} batch={args.batch}", flush=True)
    if "bare" in modes:
        for workload, count in sizes.items():
            figures.append(asyncio.run(bench_bare(settings, workload, count)))
            print(_table(figures[-1:]).splitlines()[-1], flush=True)
    # Embedded and Redis mode side by side, each workload through one then the other, so
    # that both see the same machine (others' load on a shared one drifts over minutes).
    logs = tempfile.mkdtemp(prefix="bench-")
    print(f"service logs in {logs}", flush=True)
    with contextlib.ExitStack() as stack:
        service = stack.enter_context(launch(log_path=os.path.join(logs, "service.log")))
        cluster = stack.enter_context(redis_mode(settings, logs)) if "redis" in modes else None
        for workload, count in sizes.items():
            figures.append(asyncio.run(bench_service(service.url, workload, count, args.batch)))
            print(_table(figures[-1:]).splitlines()[-1], flush=True)
            if cluster is not None:
                figure, trips[workload] = bench_redis(cluster, workload, count, args.batch)
                figures.append(figure)
                print(_table(figures[-1:]).splitlines()[-1], flush=True)
        figures.append(asyncio.run(bench_service_latency(service.url, min(n, 500))))
        print(_table(figures[-1:]).splitlines()[-1], flush=True)
        if cluster is not None:
            single = bench_service_latency(cluster.urls[0], min(n, 500), "redis-single")
            figures.append(asyncio.run(single))
            print(_table(figures[-1:]).splitlines()[-1], flush=True)
        isolation = asyncio.run(_isolation(service.url))
    if "naive" in modes:
        for workload, count in naive_sizes.items():
            figures.append(bench_naive(workload, count, parallel))
            print(_table(figures[-1:]).splitlines()[-1], flush=True)

    print("\n" + _table(figures))
    print(f"\nisolation active: {', '.join(k for k, v in isolation.items() if v is True)}")
    _compare({(f.mode, f.workload): f for f in figures}, trips, settings.slots)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "figures": [asdict(x) for x in figures],
                    "isolation": isolation,
                    "redis_round_trips_per_execution": trips,
                },
                f,
                indent=2,
            )
    return 1 if any(f.wrong for f in figures) else 0


def _compare(by: dict[tuple[str, str], Figure], trips: dict[str, float], slots: int) -> None:
    for workload in WORKLOADS:
        svc = by[("service", workload)]
        parts = [f"{workload:8}"]
        if ("naive", workload) in by:
            parts.append(
                f"service/naive = {svc.exec_per_s / by[('naive', workload)].exec_per_s:6.1f}x"
            )
        if ("bare", workload) in by:
            bare = by[("bare", workload)]
            overhead_ms = (1 / svc.exec_per_s - 1 / bare.exec_per_s) * 1000 * slots
            parts.append(f"service/bare = {svc.exec_per_s / bare.exec_per_s:5.2f}")
            parts.append(f"HTTP+queue overhead = {overhead_ms:+.2f} ms per execution per slot")
        if ("redis", workload) in by:
            parts.append(
                f"redis/service = {by[('redis', workload)].exec_per_s / svc.exec_per_s:5.2f}"
            )
            parts.append(f"Redis round trips per execution = {trips[workload]:.3f}")
        print("   ".join(parts))


async def _isolation(url: str) -> dict:  # type: ignore[type-arg]
    async with AsyncSandboxClient(url) as client:
        return dict((await client.status()).isolation)


if __name__ == "__main__":
    sys.exit(main())
