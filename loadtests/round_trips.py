"""Redis round trips of a lone request: who sends what, on the path and beside it.

    python -m loadtests.round_trips --requests 300 --workers 2

One API node's queue and ``--workers`` worker sources (echo slots: no execution, only the
queue) in one process, on a throwaway ``redis-server``; requests sent one at a time, each
after the last was answered and the workers went back to waiting. Prints, per request, the
round trips of the API node and of each worker, split into the blocking reads that return
(a wake-up: half a round trip on the path) and the calls sent, and how many takes found
nothing (a worker woken for a job another worker took).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.redis.consumer import RedisJobSource
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.service_process import RedisServer
from sandbox_service.settings import Settings


def counted(source: RedisJobSource, tally: Counter[str]) -> None:
    """Count each worker call by kind: a take, a take that found nothing, a bell read."""
    link = source.link
    script, call, pipeline = link.script, link.call, link.pipeline

    async def counting_script(s: Any, keys: list[str], args: list[Any]) -> Any:
        reply = await script(s, keys, args)
        tally[f"{s.name}"] += 1
        if s.name == "take" and reply[0] == b"empty":
            tally["take found nothing"] += 1
        return reply

    async def counting_call(command: str, *a: Any, **k: Any) -> Any:
        tally[command] += 1
        return await call(command, *a, **k)

    async def counting_pipeline(fill: Callable[..., object], each: bool = False) -> list[Any]:
        results = await pipeline(fill, each)
        name = getattr(getattr(fill, "func", fill), "__name__", "pipeline")
        tally[name] += 1
        if name == "wait_then_take":
            tally["bell reads that return"] += results[0] is not None
            tally["take found nothing"] += results[-1][0] == b"empty"
        return results

    link.script = counting_script  # type: ignore[method-assign,assignment]
    link.call = counting_call  # type: ignore[method-assign]
    link.pipeline = counting_pipeline  # type: ignore[method-assign]


async def echo_forever(source: RedisJobSource) -> None:
    while (job := await source.get()) is not None:
        await source.done(job, ExecuteResult(status=Status.ok, stdout=job.request.code))


async def measure(url: str, requests: int, workers: int) -> dict[str, Any]:
    settings = Settings(redis_url=url, slots=1, heartbeat_interval_s=3600)
    queue = RedisQueue(settings, Metrics())
    await queue.start()
    sources, tally = [], Counter[str]()
    for n in range(workers):
        source = RedisJobSource(settings, Metrics(), f"w{n}")
        await source.start(lambda: {"slots": 1, "busy": 0, "executions": 0})
        counted(source, tally)
        sources.append(source)
    loops = [asyncio.create_task(echo_forever(s)) for s in sources]
    await queue.submit([ExecuteRequest(code="warm")])
    await asyncio.sleep(0.5)
    tally.clear()
    api_before = queue.link.round_trips
    latencies = []
    for i in range(requests):
        began = time.perf_counter()
        await queue.submit([ExecuteRequest(code=str(i))])
        latencies.append(time.perf_counter() - began)
        await asyncio.sleep(0.02)  # every worker back to waiting on the bell
    api = queue.link.round_trips - api_before
    for source in sources:
        source.stop_taking()
    await asyncio.gather(*loops)
    for source in sources:
        await source.close()
    await queue.close()
    return {
        "api": api / requests,
        "workers": {k: v / requests for k, v in sorted(tally.items())},
        "p50_ms": statistics.median(latencies) * 1000,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtests.round_trips", description=__doc__)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(directory)
        redis.start()
        try:
            out = asyncio.run(measure(redis.url, args.requests, args.workers))
        finally:
            redis.stop()
    print(f"{args.requests} lone requests, {args.workers} idle workers, per request:")
    print(f"  API node: {out['api']:.2f} round trips sent (sweeps included)")
    for kind, n in out["workers"].items():
        print(f"  workers, {kind}: {n:.2f}")
    print(f"  p50 latency in one process on loopback: {out['p50_ms']:.2f} ms")


if __name__ == "__main__":
    main()
