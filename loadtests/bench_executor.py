"""Executor benchmark: the service beside the fork-per-execution floor, interleaved in one run.

    python -m loadtests.bench_executor [--n 2000] [--rounds 2] [--batch 64] [--quick]
        [--modes floor,floor-light,bare,service,redis,naive] [--codejudge-url URL] [--json F]

Modes, for each workload (trivial print, sympy factor, numpy), all set up once and measured in
turn, every workload through every mode in each round, the order reversed every other round, so
that the load of others on a shared machine hits every mode alike:

- ``floor`` / ``floor-light``: as many plain processes as slots, each forking one child per
  execution with stdout to a pipe and nothing else (``loadtests.floor_process``), with the
  service's preloads imported and warmed as the zygote does / with none;
- ``bare``: the slots driven from this process, no HTTP and no queue;
- ``service``: the embedded service over HTTP, batches of ``--batch``, four in flight, every
  isolation layer the host allows;
- ``service-full``: the same without light zygotes (every program forks from the full one);
- ``redis``: the same through Redis mode (1 API node, 2 worker nodes of half the slots each, a
  throwaway ``redis-server``), with its Redis round trips per execution;
- ``naive``: ``subprocess.run([python, "-c", code])`` per call, one per CPU in parallel;
- with ``--codejudge-url``: ``codejudge`` (code-judge's ``/run/long-batch`` at that URL) and
  ``service-cj`` (ours through its code-judge front), same client, payloads and batches.

Then single requests on the idle service (one at a time) and under light load (``--in-flight``
at once, one request each), end to end over HTTP; ``floor@1`` is one floor process alone.
Printed: exec/s and latency, the ratios (``bare / floor``, ``service / floor``, ``service /
floor-light``, ...), the CPU per execution of every role (``loadtests.cpu``) and the latency
table. Figures from one run on a shared machine are noisy: compare ratios within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

import httpx

from loadtests import bench_report
from loadtests.bench_modes import Measurement, bare_mode, floor_mode, target_mode
from loadtests.cluster import Cluster
from loadtests.cpu import ZYGOTE, Meter, Roles, children_of, fixed, me, tree_of, zygotes_of
from loadtests.floor import WARM, Floor
from loadtests.generator import Plan
from loadtests.perfprofile import Profile, ProfiledMeter
from loadtests.procwatch import listening_pid
from loadtests.targets import CodeJudgeTarget, HttpTarget, NaiveTarget, Target
from loadtests.workloads import Item
from sandbox_service.executor.pool import SlotPool
from sandbox_service.service_process import ServiceProcess, launch
from sandbox_service.settings import Settings

MODES = ("floor", "floor-light", "bare", "service", "service-full", "redis", "service-cj",
         "codejudge", "naive")  # fmt: skip
DEFAULT_MODES = ("floor", "floor-light", "bare", "service", "redis", "naive")
QUICK_MODES = ("floor", "floor-light", "bare", "service", "naive")
CODEJUDGE_MODES = ("service-cj", "codejudge")
# Modes that start an interpreter's imports per execution get the small counts, but
# floor-light only where the program imports something heavy.
SLOW = {"naive", "codejudge"}
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


def counts(n: int, quick: bool) -> tuple[dict[str, int], dict[str, int]]:
    """Executions per workload: (fast modes, modes paying for imports per execution)."""
    fast = {"trivial": n, "sympy": max(n // 4, 20), "numpy": max(n // 2, 20)}
    slow = {"trivial": max(n // 10, 10), "sympy": 2 if quick else 30,
            "numpy": 4 if quick else max(n // 40, 20)}  # fmt: skip
    return fast, slow


def _round_trips(urls: list[str]) -> float:
    """Redis round trips the nodes at ``urls`` made so far, from their /metrics."""
    total = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("sandbox_redis_round_trips_total "):
                total += float(line.split()[1])
    return total


class Bench:
    """Everything the modes measure, started once, and the way each mode is measured."""

    def __init__(self, args: argparse.Namespace, settings: Settings, logs: str) -> None:
        self.args = args
        self.settings = settings
        self.logs = logs
        self.modes: list[str] = args.mode_list
        self.floors: dict[str, Floor] = {}
        self.pool: SlotPool | None = None
        self.service: ServiceProcess | None = None
        self.cluster: Cluster | None = None
        self.roles: dict[str, Roles] = {}
        self.targets: dict[str, Target] = {}
        self.extra: dict[str, Callable[[], float]] = {}
        self.fast, self.slow_counts = counts(args.n, args.quick)
        self.round = 0
        self.profiles: list[Profile] = []

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Start what the modes need, side by side (the preloads take seconds each)."""
        s = self.settings
        if "floor" in self.modes:
            self.floors["floor"] = Floor(s.slots, list(s.preload), s.warmup)
        if "floor-light" in self.modes:
            self.floors["floor-light"] = Floor(s.slots, None)
        for floor in self.floors.values():
            stack.callback(floor.stop)
        jobs: list[Awaitable[object]] = [asyncio.to_thread(f.start) for f in self.floors.values()]
        jobs.append(asyncio.to_thread(self._start_service, stack))
        if "service-full" in self.modes:
            jobs.append(asyncio.to_thread(self._start_service, stack, "service-full"))
        if "bare" in self.modes:
            self.pool = SlotPool(s)
            stack.push_async_callback(self.pool.stop)
            jobs.append(self.pool.start())
        if "redis" in self.modes:
            cluster = Cluster(self.logs, api_nodes=1, workers=2, slots=max(1, s.slots // 2))
            jobs.append(asyncio.to_thread(lambda: stack.enter_context(cluster)))
            self.cluster = cluster
        await asyncio.gather(*jobs)
        self._roles()

    def _start_service(self, stack: contextlib.AsyncExitStack, mode: str = "service") -> None:
        """``service``, or ``service-full``: the same without light zygotes (every program
        forks from the full one), the A/B of that choice."""
        log = os.path.join(self.logs, f"{mode}.log")
        service = stack.enter_context(launch(log_path=log, light_zygote=mode == "service"))
        if mode == "service":
            self.service = service
            return
        api = fixed(service.process.pid)
        self.roles[mode] = Roles({"client": me(), "api": api, "zygote": children_of(api, ZYGOTE)})
        self.targets[mode] = HttpTarget(service.url)

    def _roles(self) -> None:
        for name, floor in self.floors.items():
            self.roles[name] = Roles({"zygote": fixed(*floor.pids)})
        if self.pool is not None:
            pool = self.pool
            self.roles["bare"] = Roles(
                {"api": me(), "zygote": lambda: zygotes_of([s.pid for s in pool.zygotes if s.pid])}
            )
        assert self.service is not None
        api = fixed(self.service.process.pid)
        self.roles["service"] = self.roles["service-cj"] = Roles(
            {"client": me(), "api": api, "zygote": children_of(api, ZYGOTE)}
        )
        self.targets["service"] = HttpTarget(self.service.url)
        self.targets["service-cj"] = CodeJudgeTarget(self.service.url, "service-cj")
        self.roles["naive"] = Roles({"client": me()}, children="client")
        self.targets["naive"] = NaiveTarget(os.cpu_count() or 1)
        if self.cluster is not None:
            self._redis_roles(self.cluster)
        if self.args.codejudge_url:
            self._codejudge_roles(self.args.codejudge_url)

    def _redis_roles(self, cluster: Cluster) -> None:
        apis = fixed(*(n.pid for n in cluster.apis))
        workers = fixed(*(n.pid for n in cluster.worker_nodes))
        redis = cluster.redis.process
        self.roles["redis"] = Roles({
            "client": me(), "api": apis, "worker": workers,
            "redis": fixed(*([redis.pid] if redis is not None else [])),
            "zygote": children_of(workers, ZYGOTE),
        })  # fmt: skip
        self.targets["redis"] = HttpTarget(cluster.urls[0], "redis")
        nodes = [n.process.url for n in cluster.nodes if n.process is not None]
        self.extra["redis"] = lambda: _round_trips(nodes)

    def _codejudge_roles(self, url: str) -> None:
        parts = urlsplit(url)
        local = parts.hostname in ("127.0.0.1", "localhost", "::1")
        api = listening_pid(parts.port or 80) if local else None
        roles = {"client": me(), "api": tree_of(fixed(*([api] if api else [])))}
        if self.args.codejudge_workers_pid:
            roles["zygote"] = children_of(fixed(self.args.codejudge_workers_pid))
        if self.args.codejudge_redis_pid:
            roles["redis"] = fixed(self.args.codejudge_redis_pid)
        self.roles["codejudge"] = Roles(roles)
        self.targets["codejudge"] = CodeJudgeTarget(url, "codejudge")

    @staticmethod
    def slow(mode: str, workload: str) -> bool:
        """Imports its modules afresh in every execution: small counts, one warm-up (nothing
        carries over from one execution to the next but the page cache)."""
        return mode in SLOW or (mode == "floor-light" and workload != "trivial")

    def count(self, mode: str, workload: str) -> int:
        total = (self.slow_counts if self.slow(mode, workload) else self.fast)[workload]
        return max(1, -(-total // self.args.rounds))  # this round's share

    def meter(self, mode: str, workload: str = "trivial") -> Meter:
        roles, extra = self.roles[mode.partition("@")[0]], self.extra.get(mode)
        if not self.args.perf:
            return Meter(roles, extra)
        name = f"{mode}-{workload}-r{self.round + 1}"
        path = os.path.join(self.args.perf, f"{name}.data")
        return ProfiledMeter(roles, extra, path=path, name=name, sink=self.profiles)

    async def measure(self, mode: str, workload: str) -> Measurement:
        code, expected = WORKLOADS[workload]
        n = self.count(mode, workload)
        warm = 1 if self.slow(mode, workload) else None
        if mode in self.floors:
            return await floor_mode(self.floors[mode], mode, workload, code, expected, n,
                                    self.meter(mode, workload), warm=warm or WARM)  # fmt: skip
        if mode == "bare":
            assert self.pool is not None
            meter = self.meter(mode, workload)
            return await bare_mode(self.pool, workload, code, expected, n, meter)
        batch = self.args.batch
        parallel = os.cpu_count() or 1
        plan = Plan(n, parallel, 1) if mode == "naive" else Plan(n, 4 * batch, batch)
        item = Item(workload, {"code": code}, expected)
        return await target_mode(self.targets[mode], mode, workload, item, n, plan,
                                 self.meter(mode, workload), warm)  # fmt: skip

    async def latency(self, in_flight: int) -> list[Measurement]:
        """Single requests, ``in_flight`` at once, on the service (and, alone, the floor,
        Redis mode and code-judge)."""
        code, expected = WORKLOADS["trivial"]
        item = Item("trivial", {"code": code}, expected)
        n = max(self.args.latency_n // self.args.rounds, 5 * in_flight)
        out = []
        idle = [m for m in ("redis", "codejudge") if m in self.targets] if in_flight == 1 else []
        for mode in ["service", *idle]:
            name = f"{mode}@{in_flight}"
            plan = Plan(n, in_flight, 1)
            out.append(await target_mode(self.targets[mode], name, "trivial", item, n, plan,
                                         self.meter(name)))  # fmt: skip
        if in_flight == 1 and "floor" in self.floors:
            out.append(await floor_mode(self.floors["floor"], "floor@1", "trivial", code,
                                        expected, n, self.meter("floor@1"), active=1))  # fmt: skip
        return out


def _show(m: Measurement, took_s: float) -> None:
    rate = m.n / m.seconds if m.seconds else 0.0
    note = f"  ({m.example[:120]!r})" if m.wrong else ""
    print(f"  {m.workload:8} {m.mode:12} {m.n:6d} {rate:8.1f} exec/s  wrong {m.wrong}  "
          f"({took_s:.1f} s){note}", flush=True)  # fmt: skip


async def run(bench: Bench, args: argparse.Namespace) -> list[Measurement]:
    measured: list[Measurement] = []
    for r in range(args.rounds):
        bench.round = r
        order = bench.modes if r % 2 == 0 else bench.modes[::-1]
        print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", flush=True)
        for workload in args.workload_list:
            for mode in order:
                t = time.monotonic()
                measured.append(await bench.measure(mode, workload))
                _show(measured[-1], time.monotonic() - t)
        for in_flight in args.in_flight_list:
            t = time.monotonic()
            for m in await bench.latency(in_flight):
                measured.append(m)
                _show(m, time.monotonic() - t)
    return measured


async def isolation(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return dict((await client.get("/v1/status")).json().get("isolation", {}))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings()
    logs = tempfile.mkdtemp(prefix="bench-")
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  slots={settings.slots} cpus={os.cpu_count()} "
          f"batch={args.batch} rounds={args.rounds} load={load[0]:.2f}; logs in {logs}",
          flush=True)  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        bench = Bench(args, settings, logs)
        started = time.monotonic()
        await bench.start(stack)
        print(f"started in {time.monotonic() - started:.1f} s", flush=True)
        assert bench.service is not None
        layers = await isolation(bench.service.url)
        measured = await run(bench, args)
    figs = bench_report.figures(measured)
    throughput = [f for f in figs if "@" not in f.mode]
    latency = [f for f in figs if "@" in f.mode]
    print("\n" + bench_report.throughput_table(throughput))
    print(f"\nisolation active: {', '.join(k for k, v in layers.items() if v is True)}\n")
    print(bench_report.ratio_table(throughput, settings.slots))
    print("\nCPU per execution, ms user/system (children: the executions; total: all but the "
          "client)")  # fmt: skip
    print(bench_report.cpu_table(figs))
    print("\nlatency of single requests, end to end (trivial)")
    print(bench_report.latency_table(latency))
    if bench.profiles:
        print("\nperf profiles: share of samples by role (short-lived children are undersampled:"
              " take totals from the CPU table), hottest symbols (% of samples)")  # fmt: skip
        print("\n".join(line for p in bench.profiles for line in p.lines()))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": sys.argv,
        "load_average": {"start": load, "end": os.getloadavg()},
        "slots": settings.slots,
        "isolation": layers,
        "figures": [asdict(f) for f in figs],
        "profiles": [asdict(p) for p in bench.profiles],
    }


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="trivial executions per mode, all rounds")
    p.add_argument("--rounds", type=int, default=2, help="times every mode is measured")
    p.add_argument("--batch", type=int, default=64, help="requests per HTTP batch")
    p.add_argument("--quick", action="store_true",
                   help="a small run (CI smoke): --n 100, 1 round, no redis")  # fmt: skip
    p.add_argument(
        "--modes",
        help=f"of {','.join(MODES)} (default: {','.join(DEFAULT_MODES)}, "
        "and the code-judge pair with --codejudge-url; service is always measured)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="which workloads")
    p.add_argument("--latency-n", type=int, default=500, help="single requests per level")
    p.add_argument("--in-flight", default="1,10,50,100", help="latency levels, comma-separated")
    p.add_argument("--codejudge-url", help="a running code-judge (docs/benchmarks.md)")
    p.add_argument("--codejudge-workers-pid", type=int,
                   help="its run_workers.py process, for its CPU")  # fmt: skip
    p.add_argument("--codejudge-redis-pid", type=int, help="its redis-server, for its CPU")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--perf", metavar="DIR",
                   help="record a perf profile of each measurement into DIR (perf)")  # fmt: skip
    args = p.parse_args(argv)
    if args.perf:
        os.makedirs(args.perf, exist_ok=True)
    if args.quick:
        args.n, args.rounds = min(args.n, 100), 1
        args.latency_n, args.in_flight = min(args.latency_n, 30), "1,10"
    default = QUICK_MODES if args.quick else DEFAULT_MODES
    if args.codejudge_url:
        default = (*default, *CODEJUDGE_MODES)
    wanted = {m.strip() for m in (args.modes or ",".join(default)).split(",") if m.strip()}
    unknown = wanted - set(MODES)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}; known: {','.join(MODES)}")
    if "codejudge" in wanted and not args.codejudge_url:
        p.error("mode codejudge needs --codejudge-url")
    args.mode_list = [m for m in MODES if m in wanted | {"service"}]
    args.workload_list = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not set(args.workload_list) <= set(WORKLOADS) or not args.workload_list:
        p.error(f"--workloads: of {','.join(WORKLOADS)}")
    args.in_flight_list = [int(x) for x in args.in_flight.split(",") if x.strip()]
    if args.rounds < 1 or args.n < 1:
        p.error("--rounds and --n must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    data = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
    return 1 if any(f["wrong"] for f in data["figures"]) else 0


if __name__ == "__main__":
    sys.exit(main())
