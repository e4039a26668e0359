"""The embedded queue's own cost per execution, without slots or HTTP.

    python -m loadtests.bench_queue [--n 40000] [--tenants 1]

Four concurrent submitters send batches of 64; two stand-in slots take each job, record it in
the metrics and answer it at once. What is left is the queue, the fair-share scheduler and the
metrics: the part of the hot path this project's tenants added to (docs/benchmarks.md). Run it
against two checkouts from their own directories to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.local import LocalQueue
from sandbox_service.settings import Settings
from sandbox_service.tenants import Tenant

BATCH = 64
SUBMITTERS = 4


async def measure(n: int, tenants: int) -> float:
    """Microseconds per execution."""
    queue = LocalQueue(Settings(slots=2, max_queue_depth=10**6))
    await queue.start()
    metrics = Metrics()

    async def slot() -> None:
        while (job := await queue.get()) is not None:
            result = ExecuteResult(status=Status.ok, wall_time_s=0.001)
            metrics.observe(result, job.tenant)
            await queue.done(job, result)

    slots = [asyncio.create_task(slot()) for _ in range(2)]
    requests = [ExecuteRequest(code="print(1)")] * BATCH
    names = [Tenant(f"t{i}") for i in range(tenants)]
    rounds = max(1, n // (BATCH * SUBMITTERS))
    started = time.perf_counter()
    for r in range(rounds):
        await asyncio.gather(
            *(queue.submit(requests, names[(r + i) % tenants]) for i in range(SUBMITTERS))
        )
    seconds = time.perf_counter() - started
    await queue.close()
    await asyncio.gather(*slots)
    return seconds / (rounds * SUBMITTERS * BATCH) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench_queue", description=__doc__)
    p.add_argument("--n", type=int, default=40_000, help="executions")
    p.add_argument("--tenants", type=int, default=1, help="tenants the batches rotate over")
    args = p.parse_args(argv)
    print(f"{asyncio.run(measure(args.n, args.tenants)):.2f} us per execution")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
