"""This service beside SandboxFusion: the same client and programs against both ``/run_code``.

    loadtests/sandboxfusion.sh install && loadtests/sandboxfusion.sh serve 8080 &
    python -m loadtests.bench_sandboxfusion [--sandboxfusion http://127.0.0.1:8080] [--rounds 2]

A documented command, not a CI step (docs/benchmarks.md, "Beside SandboxFusion"). This service
is started here with its shipped defaults (``service_process.start``; ``--set NAME=VALUE``
changes one) and reached through its SandboxFusion front; SandboxFusion is the one already
serving at ``--sandboxfusion``. Each request is one ``POST /run_code``, at most
``--concurrency`` (64) in flight, from one client. Both get an untimed warm-up of
``--concurrency`` short programs; then they are measured in turn, the order reversed every
other round, so that the machine's noise hits both alike. Batches (issue 31):

- ``hung``: 16 ``while True: pass`` at ``run_timeout`` 1: exec/s and the p99 latency;
- ``short``: ``--short`` (400) trivial programs (``print(sum(range(n)))``): exec/s;
- ``short+hung``: the same with 12 hung ones spread among them (8 spinning, 4 sleeping, timeout
  2): wall time against the ideal, the timeout plus the short batch's own time on that system
  in the same round.

Every answer is checked: a short program must print its sum, a hung one must be stopped for
time (``run_result.status`` ``TimeLimitExceeded``); the rest count as ``wrong``, and so does a
request whose connection failed (said on stderr; never sent again).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from loadtests.bench_stragglers import (
    HUNG_TIMEOUT_S,
    finish,
    rounds,
    sleeping,
    spinning,
    spread,
)
from loadtests.report import percentile
from loadtests.workloads import Context, Item, trivial_sum
from sandbox_service.service_process import start

SHORT_TIMEOUT_S = 10.0
OURS, FUSION = "sandbox-service", "SandboxFusion"


def short_batch(count: int, seed: int = 0) -> list[Item]:
    """``count`` trivial programs, each with the sum it must print."""
    rng = random.Random(seed)
    return [trivial_sum(rng, Context()) for _ in range(count)]


def batches(short: int, seed: int = 0) -> dict[str, list[Item]]:
    plain = short_batch(short, seed)
    hung = [spinning(HUNG_TIMEOUT_S)] * 8 + [sleeping(HUNG_TIMEOUT_S)] * 4
    return {
        "hung": [spinning(1.0)] * 16,
        "short": plain,
        "short+hung": spread(plain, hung, seed),
    }


def run_code_body(item: Item) -> dict[str, Any]:
    """SandboxFusion's ``/run_code`` request for ``item``."""
    request = item.request
    return {"code": request["code"], "language": "python", "stdin": request.get("stdin", ""),
            "run_timeout": request.get("timeout_s", SHORT_TIMEOUT_S)}  # fmt: skip


def outcome(response: dict[str, Any]) -> tuple[str, str | None]:
    """The native status and stdout that a ``/run_code`` answer says."""
    run = response.get("run_result") or {}
    if run.get("status") == "TimeLimitExceeded":
        return "timeout", run.get("stdout")
    if response.get("status") == "Success":
        return "ok", run.get("stdout")
    if response.get("status") == "Failed" and run.get("status") == "Finished":
        return "error", run.get("stdout")
    return "sandbox_error", None


def correct(item: Item, response: dict[str, Any]) -> bool:
    status, stdout = outcome(response)
    return item.check({"status": status, "stdout": stdout})


@dataclass
class Run:
    system: str
    batch: str
    round: int
    size: int
    wall_s: float
    p99_s: float
    wrong: int

    @property
    def rate(self) -> float:
        return self.size / self.wall_s


async def send(url: str, items: list[Item], concurrency: int) -> tuple[float, list[float], int]:
    """Wall time, each request's latency and how many answers were wrong."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def one(client: httpx.AsyncClient, item: Item) -> tuple[float, bool]:
        async with gate:
            began = time.perf_counter()
            try:
                response = await client.post(f"{url}/run_code", json=run_code_body(item))
            except httpx.TransportError as exc:  # lost: counted wrong, not sent again
                print(f"{url}: {exc!r}", file=sys.stderr)
                return time.perf_counter() - began, False
            latency = time.perf_counter() - began
        return latency, response.status_code == 200 and correct(item, response.json())

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        began = time.perf_counter()
        answers = await asyncio.gather(*(one(client, item) for item in items))
        wall = time.perf_counter() - began
    return wall, [latency for latency, _ in answers], sum(not good for _, good in answers)


def measure(urls: dict[str, str], work: dict[str, list[Item]], count: int,
            concurrency: int) -> list[Run]:  # fmt: skip
    for url in urls.values():  # warm both up (first imports, connections), untimed
        asyncio.run(send(url, work["short"][:concurrency], concurrency))
    runs = []
    for number, order in enumerate(rounds(list(urls), count), 1):
        for system in order:
            for name, items in work.items():
                wall, latencies, wrong = asyncio.run(send(urls[system], items, concurrency))
                runs.append(Run(system, name, number, len(items), wall,
                                percentile(sorted(latencies), 0.99) or 0.0, wrong))  # fmt: skip
    return runs


def report(runs: list[Run]) -> list[dict[str, Any]]:
    """A row per run; ``short+hung`` also with its ideal and the ratio to it."""
    by = {(r.system, r.batch, r.round): r for r in runs}
    rows = []
    for r in runs:
        row: dict[str, Any] = {"round": r.round, "system": r.system, "batch": r.batch,
                               "size": r.size, "wall_s": round(r.wall_s, 3),
                               "exec_per_s": round(r.rate, 1), "p99_s": round(r.p99_s, 3),
                               "wrong": r.wrong}  # fmt: skip
        short = by.get((r.system, "short", r.round))
        if r.batch == "short+hung" and short is not None:
            ideal = HUNG_TIMEOUT_S + short.wall_s
            row["ideal_s"] = round(ideal, 3)
            row["vs_ideal"] = round(r.wall_s / ideal, 2)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'round':<6}{'system':<17}{'batch':<12}{'n':>5}{'wall s':>9}{'exec/s':>9}"
             f"{'p99 s':>8}{'ideal s':>9}{'x ideal':>9}{'wrong':>7}"]  # fmt: skip
    for row in rows:
        lines.append(f"{row['round']:<6}{row['system']:<17}{row['batch']:<12}{row['size']:>5}"
                     f"{row['wall_s']:>9.2f}{row['exec_per_s']:>9.1f}{row['p99_s']:>8.2f}"
                     f"{row.get('ideal_s', ''):>9}{row.get('vs_ideal', ''):>9}"
                     f"{row['wrong']:>7}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandboxfusion", default="http://127.0.0.1:8080", help="its URL")
    parser.add_argument("--short", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of this service other than its default (repeatable)",
    )
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    settings = dict(pair.split("=", 1) for pair in args.set)
    httpx.post(f"{args.sandboxfusion}/run_code", json={"code": "", "language": "python"},
               timeout=30).raise_for_status()  # fmt: skip
    work = batches(args.short)
    with tempfile.TemporaryDirectory() as logs:
        service = start(f"{logs}/service.log", **settings)
        try:
            urls = {OURS: service.url, FUSION: args.sandboxfusion}
            rows = report(measure(urls, work, args.rounds, args.concurrency))
        finally:
            service.stop()
    print(table(rows))
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
