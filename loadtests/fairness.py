"""Two tenants on one service: does a flood of one leave the other its latency and its share?

    python -m loadtests.fairness --slots 2 --phase-s 20 --out runs/fairness

starts an embedded service with auth on and two tenants, then runs three phases of
``--phase-s`` seconds, one after another:

1. ``B alone``: tenant B sends light programs at ``--b-rate`` a second (open loop: each at its
   time, whether or not the last one is back), nobody else.
2. ``B beside A``: the same, while tenant A floods: ``--flood`` × slots long programs always in
   flight.
3. ``both flood``: A floods long programs, B floods light ones (in batches of ``--b-batch``, so
   that its queue does not run dry while its requests travel), weights ``--weights``: the slot
   time each gets (its executions' ``wall_time_s`` inside the phase) against its weight.

It prints B's p50/p99 latency (end to end, HTTP included) and throughput alone and beside A,
A's throughput, each tenant's share of the slot time and how busy the slots were (counting
only the phase itself: what is still queued at its end drains uncounted), and writes
``report.json``; the
targets (B's p99 beside A within 2× of alone, shares within 10 % of the weights) are checked
and printed, not asserted: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandbox_service.service_process import launch
from sandbox_service.tenants import Tenant, append_key

LIGHT = "print(sum(range(1000)))"
LONG = "s = 0\nfor i in range(2_000_000):\n    s += i\nprint(s)"


@dataclass
class Tally:
    """What one tenant got in one phase: latencies, and each execution's (end, wall time)."""

    latencies: list[float] = field(default_factory=list)
    runs: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0

    def add(self, started: float, results: list[dict[str, Any]] | None) -> None:
        now = time.monotonic()
        if results is None or any(r.get("status") != "ok" for r in results):
            self.failed += 1
            return
        self.latencies.append(now - started)
        self.runs.extend((now, float(r.get("wall_time_s", 0.0))) for r in results)

    def slot_s(self, start: float, end: float) -> float:
        """Slot time inside [start, end]: each run taken as ending when its answer came."""
        return sum(max(0.0, min(end, t) - max(start, t - wall)) for t, wall in self.runs)


async def _one(http: httpx.AsyncClient, code: str, tally: Tally, batch: int = 1) -> None:
    started = time.monotonic()
    try:
        if batch == 1:
            response = await http.post("/v1/execute", json={"code": code, "timeout_s": 30})
            answer = [response.json()] if response.status_code == 200 else None
        else:
            body = {"requests": [{"code": code, "timeout_s": 30}] * batch}
            response = await http.post("/v1/execute/batch", json=body)
            answer = response.json()["results"] if response.status_code == 200 else None
        tally.add(started, answer)
    except httpx.HTTPError:
        tally.add(started, None)


async def _steady(http: httpx.AsyncClient, rate: float, until: float, tally: Tally) -> None:
    """Open loop: one light request every 1/rate seconds, each on its own."""
    sent: list[asyncio.Task[None]] = []
    next_at = time.monotonic()
    while next_at < until:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        sent.append(asyncio.create_task(_one(http, LIGHT, tally)))
        next_at += 1 / rate
    await asyncio.gather(*sent)


async def _flood(
    http: httpx.AsyncClient, code: str, lanes: int, until: float, tally: Tally, batch: int = 1
) -> None:
    """Closed loop: ``lanes`` requests (of ``batch`` programs) always in flight until ``until``."""

    async def lane() -> None:
        while time.monotonic() < until:
            await _one(http, code, tally, batch)

    await asyncio.gather(*(lane() for _ in range(lanes)))


def _summary(tally: Tally, start: float, end: float) -> dict[str, float]:
    lat = sorted(tally.latencies)
    if not lat:
        return {"count": 0, "failed": tally.failed}
    done = sum(1 for t, _ in tally.runs if t <= end)
    return {
        "requests": len(lat),
        "failed": tally.failed,
        "executions_per_s": round(done / (end - start), 2),
        "p50_ms": round(1000 * statistics.median(lat), 1),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
        "slot_s": round(tally.slot_s(start, end), 2),
    }


async def slot_seconds(http: httpx.AsyncClient) -> dict[str, float]:
    """``sandbox_tenant_slot_seconds_total`` per tenant, from /metrics (an admin key)."""
    text = (await http.get("/metrics")).text
    found = {}
    for line in text.splitlines():
        if line.startswith("sandbox_tenant_slot_seconds_total{"):
            tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
            found[tenant] = float(line.rsplit(" ", 1)[1])
    return found


async def run(url: str, keys: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    lanes = args.flood * args.slots
    timeout = httpx.Timeout(120.0)
    limits = httpx.Limits(max_connections=lanes + 64)
    clients = {}
    for name, key in keys.items():
        headers = {"Authorization": f"Bearer {key}"}
        clients[name] = httpx.AsyncClient(
            base_url=url, timeout=timeout, limits=limits, headers=headers
        )
    a, b, ops = clients["A"], clients["B"], clients["ops"]
    phases: dict[str, dict[str, Any]] = {}
    for name, with_a, b_floods in (("B alone", False, False), ("B beside A", True, False),
                                   ("both flood", True, True)):  # fmt: skip
        print(f"phase {name!r}: {args.phase_s:g} s", file=sys.stderr)
        tallies = {"A": Tally(), "B": Tally()}
        before = await slot_seconds(ops)
        start = time.monotonic()
        until = start + args.phase_s
        work = []
        if b_floods:  # batches, so that B's queue is never empty while its lanes wait on HTTP
            work.append(_flood(b, LIGHT, lanes, until, tallies["B"], args.b_batch))
        else:
            work.append(_steady(b, args.b_rate, until, tallies["B"]))
        if with_a:
            work.append(_flood(a, LONG, lanes, until, tallies["A"]))

        async def at_the_end(until: float = until) -> dict[str, float]:
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            return await slot_seconds(ops)

        # What is still out at the end runs on (drained before the next phase): not counted.
        ending = asyncio.ensure_future(at_the_end())
        await asyncio.gather(ending, *work)
        after = ending.result()
        phases[name] = {t: _summary(tally, start, until) for t, tally in tallies.items()}
        # The server's own count: slot time from taking a job to answering it (wall_time_s
        # leaves out fork, set-up and the answer, which is most of a light program's slot).
        served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in tallies}
        total = sum(served.values()) or 1.0
        for t in tallies:
            phases[name][t]["served_slot_s"] = round(served[t], 2)
            phases[name][t]["served_share"] = round(served[t] / total, 3)
        used = sum(tally.slot_s(start, until) for tally in tallies.values()) or 1.0
        for t, tally in tallies.items():
            phases[name][t]["slot_share"] = round(tally.slot_s(start, until) / used, 3)
        phases[name]["slot_busy"] = round(used / (args.phase_s * args.slots), 3)
    for client in clients.values():
        await client.aclose()
    return phases


def _verdict(phases: dict[str, Any], weights: tuple[float, float]) -> list[str]:
    alone, beside = phases["B alone"]["B"], phases["B beside A"]["B"]
    lines = []
    if alone.get("requests") and beside.get("requests"):
        ratio = beside["p99_ms"] / alone["p99_ms"]
        met = "met" if ratio <= 2 else "NOT met"
        lines.append(f"B's p99 beside A / alone: {ratio:.2f} (target <= 2: {met})")
    flood = phases["both flood"]
    for tenant, weight in zip(("A", "B"), weights, strict=True):
        want = weight / sum(weights)
        got = flood[tenant].get("served_share", 0.0)
        off = abs(got - want) / want
        met = "met" if off <= 0.10 else "NOT met"
        lines.append(f"{tenant}'s slot share {got:.3f} vs weight {want:.3f}: {100 * off:.1f} % "
                     f"off (target <= 10 %: {met})")  # fmt: skip
    return lines


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.fairness", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--slots", type=int, default=2, help="slots of the service")
    p.add_argument("--phase-s", type=float, default=20.0, help="seconds of each phase")
    p.add_argument("--b-rate", type=float, default=10.0, help="B's light requests a second")
    p.add_argument("--flood", type=int, default=10, help="A's requests in flight, x slots")
    p.add_argument("--b-batch", type=int, default=8, help="B's programs per request when it floods")
    p.add_argument("--weights", default="1,2", help="weights of A and B")
    p.add_argument("--reserve", type=int, default=None,
                   help="tenant_reserve_slots of the service (default: its own, 1)")  # fmt: skip
    p.add_argument("--out", help="directory for report.json")
    args = p.parse_args(argv)
    try:
        wa, wb = (float(w) for w in args.weights.split(","))
    except ValueError:
        p.error("--weights: two numbers, A's and B's, e.g. 1,2")
    if min(wa, wb) <= 0 or args.slots < 1 or args.phase_s <= 0 or args.b_rate <= 0:
        p.error("--weights, --slots, --phase-s and --b-rate must be positive")
    args.weight_pair = (wa, wb)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="fairness-") as scratch:
        path = os.path.join(scratch, "keys")
        keys = {
            name: append_key(path, Tenant(name, weight=weight))[0]
            for name, weight in zip(("A", "B"), args.weight_pair, strict=True)
        }
        keys["ops"] = append_key(path, Tenant("ops", admin=True))[0]  # reads /metrics
        settings: dict[str, Any] = {"slots": args.slots, "api_keys_file": path,
                                    "preload": "math", "max_queue_depth": 1_000_000,
                                    "work_root": os.path.join(scratch, "work")}  # fmt: skip
        if args.reserve is not None:
            settings["tenant_reserve_slots"] = args.reserve
        with launch(os.path.join(scratch, "service.log"), **settings) as service:
            phases = asyncio.run(run(service.url, keys, args))
    report = {"settings": {k: v for k, v in settings.items() if k not in ("api_keys_file",
              "work_root")}, "weights": args.weight_pair, "phase_s": args.phase_s,
              "b_rate": args.b_rate, "flood_lanes": args.flood * args.slots,
              "cpus": os.cpu_count(), "phases": phases}  # fmt: skip
    report["verdict"] = _verdict(phases, args.weight_pair)
    print(json.dumps(phases, indent=2))
    for line in report["verdict"]:
        print(line)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
