"""Fault soak: the mixed workload on a Redis-mode deployment while its parts are killed.

    python -m loadtests.faults --duration 300 --interval 5 --out runs/faults

starts a throwaway Redis, ``--api-nodes`` API nodes and ``--workers`` worker nodes on
loopback, drives them with the mixed workload (every request with an ``id``), and every
``--interval`` seconds does the next fault of ``--faults`` in turn:

- ``zygote``: SIGKILL one zygote of a worker (the slot restarts it; its execution is retried);
- ``worker``: SIGKILL a worker node, start it again a little later under the same name (the
  jobs it held are reclaimed by the others after the visibility timeout);
- ``api``: SIGKILL an API node, start it again on its port (the client resends the batches
  whose connection broke, with the same ids, to another node);
- ``redis``: SIGKILL Redis and start an empty one on its port (the queue's contents are gone:
  the API nodes answer what they were waiting for ``rejected``, saying Redis lost it);
- ``failover`` (Redis runs as a primary, a replica and three Sentinels): SIGKILL the primary;
  the Sentinels promote the replica, the nodes follow it, and what the replica lacked is
  answered ``rejected``; the dead primary comes back as the new one's replica;
- ``partition``: SIGSTOP the Redis primary for ``PARTITION_S`` and let it go on: every node is
  cut off from Redis and back (with Sentinels, a failover, and the old primary returning
  stale until they demote it);
- ``stall``: SIGSTOP a worker node past the visibility timeout and let it go on: its jobs are
  taken over meanwhile, its late answers dropped.

The first four are the default; ``--faults failover`` (or ``partition`` with ``--sentinel``)
runs Redis with Sentinels.

Afterwards every request must be accounted for: answered once, with its own id, and either
correct or an explicit infrastructure status with a message (``internal_error``,
``queue_timeout``, ``rejected``); none lost. Then, idle, the deployment must be back to its
baseline: every node up and registered, the queue empty, no process beyond the nodes and
their zygotes, no zombie, no leftover file in the work root, memory within bounds of the
baseline. Exits 1 if any check fails. Bounded: the load lasts ``--duration`` or until every
kind of fault has been done once, whichever is later (on a loaded machine nodes take seconds
to come back), one ``--interval`` more for recovery, and never more than ``OVERRUN`` ×
``--duration``; answers still out then get ``--drain`` more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtests import plots, report
from loadtests.cluster import Cluster, Node
from loadtests.generator import SERVICE_FAILURES, Plan, Run, measure
from loadtests.procwatch import Watcher, all_procs, count_all, keepers, tree
from loadtests.targets import HttpTarget
from loadtests.workloads import Context, Item, parse
from sandbox_service.sentinel_process import pause

FAULTS = ("zygote", "worker", "api", "redis", "failover", "partition", "stall")
DEFAULT_FAULTS = FAULTS[:4]
EXPLICIT = SERVICE_FAILURES | {"rejected"}  # rejected: never ran, or Redis lost it
PARTITION_S = 3.0  # Redis silent this long (with Sentinels: past their down-after)
OVERRUN = 4  # the longest the load may last, in --duration: until every kind was done once
SETTINGS = {"visibility_timeout_s": 4, "heartbeat_interval_s": 1, "max_attempts": 3}
MEMORY_SLACK = 1.5  # idle RSS after the soak may be this much of the baseline's...
MEMORY_SLACK_MB = 64  # ...plus this (allocator arenas, caches warmed by the load)


@dataclass(frozen=True)
class Tolerant(Item):
    """An item that must come back with its own id, and correct or explicitly failed."""

    def check(self, result: dict[str, Any]) -> bool:
        if result.get("id") != self.request["id"]:
            return False
        if result.get("status") in EXPLICIT and result.get("message"):
            return True
        return super().check(result)


@dataclass
class Fault:
    at_s: float
    kind: str
    target: str
    seconds: float = 0.0  # until the part was back
    error: str = ""


@dataclass
class Soak:
    cluster: Cluster
    kinds: list[str]
    interval_s: float
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    load_until: float = math.inf  # set once the faults are done: the load stops then

    def zygote(self) -> str:
        node = self.rng.choice(self.cluster.worker_nodes)
        zygotes = [p.pid for p in tree(node.pid)[1:] if p.ppid == node.pid]
        if not zygotes:
            return f"{node.name}: no zygote up"
        victim = self.rng.choice(zygotes)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        return f"{node.name} zygote {victim}"

    def node(self, node: Node) -> str:
        # Down long enough that the others notice, and work goes on meanwhile.
        self.cluster.restart(node, down_s=self.rng.uniform(0.2, 1.5))
        return node.name

    def worker(self) -> str:
        return self.node(self.rng.choice(self.cluster.worker_nodes))

    def api(self) -> str:
        return self.node(self.rng.choice(self.cluster.apis))

    def redis(self) -> str:
        self.cluster.restart_redis(down_s=self.rng.uniform(0.5, 2.0))
        return f"redis on port {self.cluster.redis.port}"

    def failover(self) -> str:
        took = self.cluster.fail_over()
        return f"Redis primary killed; replica promoted in {took:.2f} s"

    def partition(self) -> str:
        group = self.cluster.group
        server = group.primary() if group is not None else self.cluster.redis
        assert server.process is not None
        pause(server.process, PARTITION_S)
        return f"Redis on port {server.port} silent for {PARTITION_S:g} s"

    def stall(self) -> str:
        node = self.rng.choice(self.cluster.worker_nodes)
        assert node.process is not None
        pause(node.process.process, float(SETTINGS["visibility_timeout_s"]) + 2)
        return f"{node.name} silent past the visibility timeout"

    def once(self, kind: str) -> Fault:
        fault = Fault(round(time.monotonic() - self.started, 2), kind, "")
        began = time.monotonic()
        try:
            fault.target = getattr(self, kind)()
        except Exception as exc:  # a node that did not come back is a finding, not a crash
            fault.error = f"{type(exc).__name__}: {str(exc)[-500:]}"
        fault.seconds = round(time.monotonic() - began, 2)
        return fault

    def _done(self, until: float, hard_until: float) -> bool:
        every_kind = set(self.kinds) <= {f.kind for f in self.faults}
        next_end = time.monotonic() + self.interval_s
        return (every_kind and next_end > until) or next_end > hard_until

    async def run(self, watcher: Watcher, until: float, hard_until: float) -> None:
        """Faults in turn until ``until`` and every kind done once (never past ``hard_until``),
        then the load gets one interval more to recover under."""
        try:
            await self._run(watcher, until, hard_until)
        finally:
            self.load_until = time.monotonic() + self.interval_s

    def load(self, items: Iterator[Item]) -> Iterator[Item]:
        """``items`` until the faults are done: the load generator stops when they end."""
        for item in items:
            if time.monotonic() > self.load_until:
                return
            yield item

    async def _run(self, watcher: Watcher, until: float, hard_until: float) -> None:
        for kind in itertools.cycle(self.kinds):
            await asyncio.sleep(self.interval_s)
            if self._done(until, hard_until):
                return
            fault = await asyncio.to_thread(self.once, kind)
            watcher.pids = self.cluster.pids  # restarted nodes have new pids
            self.faults.append(fault)
            print(f"\n[{fault.at_s:7.1f} s] {kind}: {fault.target or fault.error} "
                  f"({fault.seconds} s)", file=sys.stderr)  # fmt: skip


def with_ids(items: Iterator[Item], tag: str) -> Iterator[Item]:
    for n, item in enumerate(items):
        request = {**item.request, "id": f"{tag}-{n}"}
        yield Tolerant(item.kind, request, item.stdout, item.statuses)


def slot_processes(cluster: Cluster) -> dict[str, Any]:
    """Processes of the deployment, idle: each node and its zygotes, nothing else, no zombie;
    and none anywhere running as a slot uid of any worker, past or present."""
    table = all_procs()
    expected = len(cluster.apis) + len(cluster.worker_nodes) * (1 + cluster.slots)
    found = [p for pid in cluster.pids for p in tree(pid, table)]
    kept = keepers(found, table)  # a zygote's keeper is counted as part of the zygote
    found = [p for p in found if p.pid not in kept]
    uids = {uid for node in cluster.worker_nodes for uid in node.uids}
    strays = []
    for pid in table:
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid in uids:
                strays.append(pid)
    return {
        "expected": expected,
        "found": len(found),
        "zombies": sum(p.state == "Z" for p in found),
        "slot_uid_processes": strays,
    }


def rss_mb(cluster: Cluster) -> float:
    table = all_procs()
    return round(sum(p.rss_mb for pid in cluster.pids for p in tree(pid, table)), 1)


def settle(cluster: Cluster, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until every node is ready, every worker registered and the queue empty."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            ready = all(
                httpx.get(f"{n.process.url}/readyz", timeout=5).status_code == 200
                for n in cluster.nodes
                if n.process is not None
            )
            last = httpx.get(f"{cluster.urls[0]}/v1/status", timeout=5).json()
        except httpx.HTTPError as exc:
            last = {"error": repr(exc)}
            time.sleep(0.5)
            continue
        workers = sorted(w["name"] for w in last.get("workers", []))
        if (
            ready
            and workers == sorted(n.name for n in cluster.worker_nodes)
            and last.get("queue_depth") == 0
            and last.get("in_flight") == 0
        ):
            break
        time.sleep(0.5)
    time.sleep(1.0)  # the last executions' children are reaped, their directories emptied
    return {k: last.get(k) for k in ("queue_depth", "in_flight", "workers", "error") if k in last}


def checks(run: Run, baseline: dict[str, Any], after: dict[str, Any]) -> dict[str, bool]:
    r = run.recorder
    procs = after["processes"]
    return {
        "every request answered (0 lost)": r.lost == 0 and r.answered == r.sent,
        "every answer its own and correct or explicit (0 wrong)": r.wrong == 0,
        "no request left waiting until the client gave up": not run.retries.get("timeout"),
        "every worker registered, queue empty": (
            after["status"].get("queue_depth") == 0
            and after["status"].get("in_flight") == 0
            and len(after["status"].get("workers") or []) == baseline["workers"]
        ),
        "processes back to the nodes and their zygotes, no zombie": (
            # As many as idle before the faults: nodes, zygotes (and light zygotes, if on).
            procs["found"] == baseline["processes"]["found"] >= procs["expected"]
            and procs["zombies"] == 0
            and not procs["slot_uid_processes"]
        ),
        "no leftover file in the work root": after["scratch_entries"]
        == baseline["scratch_entries"],
        "idle memory back within bounds": (
            after["rss_mb"] <= baseline["rss_mb"] * MEMORY_SLACK + MEMORY_SLACK_MB
        ),
        "every part came back": all(not f["error"] for f in after["faults"]),
    }


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.faults",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load and faults")
    p.add_argument("--drain", type=float, default=120.0, help="seconds for answers still out")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between faults")
    p.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                   help=f"kinds, done in turn, of {', '.join(FAULTS)}")  # fmt: skip
    p.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis as a primary, a replica and three Sentinels (failover implies it)",
    )
    p.add_argument("--api-nodes", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=1, help="slots per worker node")
    p.add_argument("--workload", default="mixed")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--count", type=int, default=1_000_000, help="at most this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting of every node, e.g. preload=math")  # fmt: skip
    p.add_argument("--out", help="report directory (default: runs/faults-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    args = p.parse_args(argv)
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        p.error(f"--faults: unknown {sorted(unknown)}; known: {', '.join(FAULTS)}")
    if args.duration <= 0 or args.interval <= 0:
        p.error("--duration and --interval must be positive")
    if min(args.api_nodes, args.workers, args.slots, args.concurrency, args.batch) < 1:
        p.error("--api-nodes, --workers, --slots, --concurrency and --batch must be >= 1")
    if "api" in args.faults.split(",") and args.api_nodes < 2:
        p.error("--faults api needs --api-nodes 2 or more: the client resends to another node")
    args.sentinel = args.sentinel or "failover" in args.faults.split(",")
    if args.sentinel and "redis" in args.faults.split(","):
        p.error("--faults redis restarts a lone Redis empty: not with Sentinels (use failover)")
    return args


async def soak(args: argparse.Namespace, cluster: Cluster, scratch: list[str]) -> dict[str, Any]:
    workload = parse(args.workload)
    url = ",".join(cluster.urls)
    target = HttpTarget(url, "service", timeout_s=120, resend=True)
    port = int(cluster.urls[0].rsplit(":", 1)[1])
    tag = f"soak-{uuid.uuid4().hex[:8]}"
    warm = Plan(32, 16, 8, 120, 60)
    await measure(target, with_ids(workload.items(32, args.seed + 1, Context(port)), tag + "w"),
                  warm, workload=workload.name, target_name=url, progress=False)  # fmt: skip
    await asyncio.to_thread(settle, cluster)
    baseline = {
        "rss_mb": rss_mb(cluster),
        "scratch_entries": count_all(scratch),
        "processes": slot_processes(cluster),
        "workers": len(cluster.worker_nodes),
    }
    print(f"baseline: {baseline}", file=sys.stderr)
    watcher = Watcher(cluster.pids, cluster.urls[0], scratch, 1.0)
    longest = OVERRUN * args.duration
    plan = Plan(args.count, args.concurrency, args.batch, longest + args.interval, args.drain)
    chaos = Soak(cluster, args.faults.split(","), args.interval, random.Random(args.seed))
    now = time.monotonic()
    faults = asyncio.create_task(chaos.run(watcher, now + args.duration, now + longest))
    try:
        items = chaos.load(with_ids(workload.items(args.count, args.seed, Context(port)), tag))
        run = await measure(target, items, plan, workload=workload.name, target_name=url,
                            watcher=watcher, progress=not args.quiet)  # fmt: skip
    finally:
        faults.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await faults
    status = await asyncio.to_thread(settle, cluster)
    after = {
        "rss_mb": rss_mb(cluster),
        "scratch_entries": count_all(scratch),
        "processes": slot_processes(cluster),
        "status": status,
        "faults": [f.__dict__ for f in chaos.faults],
    }
    verdict = checks(run, baseline, after)
    return {"run": run, "baseline": baseline, "after": after, "checks": verdict}


def summarize(result: dict[str, Any], fig: dict[str, Any], args: argparse.Namespace) -> str:
    r: Run = result["run"]
    kinds = Counter(f["kind"] for f in result["after"]["faults"])
    lines = [
        "# Fault soak",
        "",
        f"{args.api_nodes} API node(s), {args.workers} worker node(s) of {args.slots} slot(s), "
        f"workload {args.workload}, {args.concurrency} in flight in batches of {args.batch}, "
        f"{args.duration:.0f} s or until every kind of fault was done, a fault every "
        f"{args.interval:.0f} s; Redis {'with Sentinels' if args.sentinel else 'alone'}.",
        "",
        f"- faults: {dict(kinds)}",
        f"- requests: {r.recorder.sent} sent, {fig['answered']} answered, {fig['lost']} lost, "
        f"{fig['wrong']} wrong; {fig['exec_per_s']} exec/s",
        f"- statuses: {dict(r.recorder.statuses)}",
        f"- explicit failures (the service's, with a message): {dict(r.recorder.service_failures)}",
        f"- answered rejected (never ran, or Redis lost it; safe to resend): "
        f"{r.recorder.statuses.get('rejected', 0)}",
        f"- client retries: {r.retries}",
        f"- baseline (idle, before): {result['baseline']}",
        f"- after (idle): rss_mb {result['after']['rss_mb']}, "
        f"processes {result['after']['processes']}, "
        f"scratch entries {result['after']['scratch_entries']}",
        "",
        "| check | passed |",
        "|---|---|",
        *(f"| {name} | {'yes' if ok else '**NO**'} |" for name, ok in result["checks"].items()),
    ]
    if r.recorder.wrong_examples:
        lines += ["", "wrong answers (first few):", ""]
        lines += [f"- `{json.dumps(w)[:300]}`" for w in r.recorder.wrong_examples[:5]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    out = args.out or os.path.join("runs", time.strftime("faults-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    settings: dict[str, Any] = dict(SETTINGS)
    for pair in args.set:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected NAME=VALUE")
        settings[name.strip()] = value.strip()
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch:
        work_root, tmp = os.path.join(scratch, "work"), os.path.join(scratch, "tmp")
        os.makedirs(tmp)
        settings["work_root"] = work_root
        print(f"starting {args.api_nodes} API node(s), {args.workers} worker node(s); "
              f"logs: {out}", file=sys.stderr)  # fmt: skip
        with Cluster(out, args.api_nodes, args.workers, args.slots, settings,
                     {"TMPDIR": tmp}, sentinel=args.sentinel) as cluster:  # fmt: skip
            result = asyncio.run(soak(args, cluster, [work_root, tmp]))
    run: Run = result["run"]
    fig = report.figures(run)
    text = summarize(result, fig, args)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    data = {
        "command": ["python -m loadtests.faults", *(sys.argv[1:] if argv is None else argv)],
        "figures": fig,
        "baseline": result["baseline"],
        "after": result["after"],
        "checks": result["checks"],
    }
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(data, f, indent=2, default=str)
    plots.faults(os.path.join(out, "faults.png"), fig, result["after"]["faults"])
    print("\n" + text)
    print(f"written: {out}/summary.md, report.json, faults.png")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
