"""The queue contract, one test for both transports: the in-process queue and the Redis queue.

What an API node may rely on whichever queue it holds: results in request order, a batch
admitted or refused whole, a start deadline that holds with no worker at all, and one
execution for every submission of one ``id``. What only one transport does (chunks, round
trips, take-overs, tenants' fair share) is tested in ``test_local.py`` and ``test_redis.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from sandbox_service.models import ExecuteRequest, Status
from sandbox_service.queue.base import JobSource, Queue, QueueFull
from sandbox_service.queue.local import LocalQueue
from sandbox_service.settings import Settings
from tests.sandbox_service.queue.stand_ins import (
    api_queue,
    echo,
    redis_settings,
    run,
    started_source,
)
from tests.sandbox_service.redis_helpers import RedisServer


@dataclass
class Transport:
    """How to open a queue of one kind with some settings, and a job source beside it."""

    name: str
    redis: RedisServer | None = None
    prefix: str = ""

    @asynccontextmanager
    async def open(
        self, **overrides: Any
    ) -> AsyncIterator[tuple[Queue, Callable[[], Awaitable[JobSource]]]]:
        overrides = {"max_queue_depth": 10, **overrides}
        async with AsyncExitStack() as stack:
            if self.redis is None:
                local = LocalQueue(Settings(**{"max_queue_wait_s": 30, **overrides}))
                await local.start()
                stack.push_async_callback(local.close)

                async def same_queue() -> JobSource:
                    return local

                yield local, same_queue
                return
            settings = redis_settings(self.redis, self.prefix, **overrides)
            queue = await api_queue(settings)
            stack.push_async_callback(queue.close)

            async def source() -> JobSource:
                taker = await started_source(settings)
                stack.push_async_callback(taker.close)
                return taker

            yield queue, source


@pytest.fixture(params=["local", "redis"])
def transport(request: pytest.FixtureRequest) -> Transport:
    if request.param == "local":
        return Transport("local")
    redis = request.getfixturevalue("redis_server")
    return Transport("redis", redis, request.getfixturevalue("prefix"))


async def _held(queue: Queue, jobs: int) -> None:
    """Until ``queue`` holds ``jobs`` jobs (the Redis queue admits in its own round trip)."""
    while sum(await queue.depth()) < jobs:
        await asyncio.sleep(0.01)


def test_results_in_request_order(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open() as (queue, source):
            echoing = asyncio.create_task(echo(await source(), 8))
            results = await queue.submit([ExecuteRequest(code=str(i)) for i in range(8)])
            await echoing
            assert [r.stdout for r in results] == [str(i) for i in range(8)]

    run(main)


def test_full_queue_refuses_the_whole_batch(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open(max_queue_depth=5, retry_after_s=3) as (queue, source):
            pending = asyncio.create_task(queue.submit([ExecuteRequest(code="a")] * 4))
            await _held(queue, 4)
            with pytest.raises(QueueFull) as info:
                await queue.submit([ExecuteRequest(code="b")] * 2)
            assert (info.value.depth, info.value.limit, info.value.retry_after) == (4, 5, 3)
            assert sum(await queue.depth()) == 4  # the refused batch left nothing behind
            await echo(await source(), 4)
            assert [r.stdout for r in await pending] == ["a"] * 4

    run(main)


def test_deadline_passes_with_no_worker_at_all(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open(max_queue_wait_s=0.5) as (queue, _):
            started = time.monotonic()
            results = await queue.submit([ExecuteRequest(code="x")] * 5)
            assert time.monotonic() - started < 3
            assert {r.status for r in results} == {Status.queue_timeout}
            assert "not started within 0.5 s" in results[0].message
            assert sum(await queue.depth()) == 0  # answered and removed: nothing runs it

    run(main)


def test_same_id_runs_once_then_is_answered_from_the_results_kept(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open() as (queue, source):
            request = ExecuteRequest(code="once", id="k1")
            first = asyncio.create_task(queue.submit([request]))
            second = asyncio.create_task(queue.submit([request, request]))
            await _held(queue, 1)
            await asyncio.sleep(0.1)  # the second submission joins rather than queues
            assert sum(await queue.depth()) == 1  # one job for three submissions
            await echo(await source(), 1)
            assert [r.stdout for r in await first] == ["once"]
            assert [r.stdout for r in await second] == ["once", "once"]
            again = await queue.submit([request])  # kept: answered with no worker
            assert again[0].stdout == "once"

    run(main)
