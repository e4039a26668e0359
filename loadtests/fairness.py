"""Two tenants on one service: does a flood of one leave the other its latency and its share?

    python -m loadtests.fairness --slots 2 --phase-s 20 --out runs/fairness

starts an embedded service with auth on and two tenants, then runs three phases of
``--phase-s`` seconds, one after another:

1. ``B alone``: tenant B sends light programs at ``--b-rate`` a second (open loop: each at its
   time, whether or not the last one is back), nobody else.
2. ``B beside A``: the same, while tenant A floods: ``--flood`` × slots long programs always in
   flight.
3. ``both flood``: A floods long programs, B floods light ones, weights ``--weights``: the slot
   time each gets (the sum of its executions' ``wall_time_s``) against its weight.

It prints B's p50/p99 latency (end to end, HTTP included) and throughput alone and beside A,
A's throughput, and each tenant's share of the slot time, and writes ``report.json``; the
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

from sandbox_service.launch import launch
from sandbox_service.tenants import Tenant, append_key

LIGHT = "print(sum(range(1000)))"
LONG = "s = 0\nfor i in range(2_000_000):\n    s += i\nprint(s)"


@dataclass
class Tally:
    """What one tenant got in one phase."""

    latencies: list[float] = field(default_factory=list)
    slot_s: float = 0.0
    failed: int = 0

    def add(self, started: float, body: dict[str, Any] | None) -> None:
        if body is None or body.get("status") != "ok":
            self.failed += 1
            return
        self.latencies.append(time.monotonic() - started)
        self.slot_s += float(body.get("wall_time_s", 0.0))


async def _one(http: httpx.AsyncClient, code: str, tally: Tally) -> None:
    started = time.monotonic()
    try:
        response = await http.post("/v1/execute", json={"code": code, "timeout_s": 30})
        tally.add(started, response.json() if response.status_code == 200 else None)
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
    http: httpx.AsyncClient, code: str, lanes: int, until: float, tally: Tally
) -> None:
    """Closed loop: ``lanes`` requests always in flight until ``until``."""

    async def lane() -> None:
        while time.monotonic() < until:
            await _one(http, code, tally)

    await asyncio.gather(*(lane() for _ in range(lanes)))


def _summary(tally: Tally, seconds: float) -> dict[str, float]:
    lat = sorted(tally.latencies)
    if not lat:
        return {"count": 0, "failed": tally.failed}
    return {
        "count": len(lat),
        "failed": tally.failed,
        "per_s": round(len(lat) / seconds, 2),
        "p50_ms": round(1000 * statistics.median(lat), 1),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
        "slot_s": round(tally.slot_s, 2),
    }


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
    a, b = clients["A"], clients["B"]
    phases: dict[str, dict[str, Any]] = {}
    for name, with_a, b_floods in (("B alone", False, False), ("B beside A", True, False),
                                   ("both flood", True, True)):  # fmt: skip
        print(f"phase {name!r}: {args.phase_s:g} s", file=sys.stderr)
        tallies = {"A": Tally(), "B": Tally()}
        until = time.monotonic() + args.phase_s
        work = []
        if b_floods:
            work.append(_flood(b, LIGHT, lanes, until, tallies["B"]))
        else:
            work.append(_steady(b, args.b_rate, until, tallies["B"]))
        if with_a:
            work.append(_flood(a, LONG, lanes, until, tallies["A"]))
        started = time.monotonic()
        await asyncio.gather(*work)
        seconds = time.monotonic() - started
        phases[name] = {t: _summary(tally, seconds) for t, tally in tallies.items()}
        used = sum(tally.slot_s for tally in tallies.values()) or 1.0
        for t, tally in tallies.items():
            phases[name][t]["slot_share"] = round(tally.slot_s / used, 3)
        phases[name]["slot_busy"] = round(used / (seconds * args.slots), 3)
    for client in clients.values():
        await client.aclose()
    return phases


def _verdict(phases: dict[str, Any], weights: tuple[float, float]) -> list[str]:
    alone, beside = phases["B alone"]["B"], phases["B beside A"]["B"]
    lines = []
    if alone.get("count") and beside.get("count"):
        ratio = beside["p99_ms"] / alone["p99_ms"]
        met = "met" if ratio <= 2 else "NOT met"
        lines.append(f"B's p99 beside A / alone: {ratio:.2f} (target <= 2: {met})")
    flood = phases["both flood"]
    for tenant, weight in zip(("A", "B"), weights, strict=True):
        want = weight / sum(weights)
        got = flood[tenant].get("slot_share", 0.0)
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
