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

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import JobSource, Queue, QueueFull
from sandbox_service.queue.local import LocalQueue
from sandbox_service.queue.redis.consumer import RedisJobSource
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.settings import Settings


@dataclass
class Transport:
    """How to open a queue of one kind with some settings, and a job source beside it."""

    name: str
    base: dict[str, Any]

    @asynccontextmanager
    async def open(
        self, **overrides: Any
    ) -> AsyncIterator[tuple[Queue, Callable[[], Awaitable[JobSource]]]]:
        settings = Settings(**{**self.base, **overrides})
        async with AsyncExitStack() as stack:
            if self.name == "local":
                local = LocalQueue(settings)
                await local.start()
                stack.push_async_callback(local.close)

                async def same_queue() -> JobSource:
                    return local

                yield local, same_queue
                return
            queue = RedisQueue(settings, Metrics())
            await queue.start()
            stack.push_async_callback(queue.close)

            async def source() -> JobSource:
                taker = RedisJobSource(settings, Metrics(), "w1")
                await taker.start(lambda: {"slots": 2, "busy": 0, "executions": 0})
                stack.push_async_callback(taker.close)
                return taker

            yield queue, source


@pytest.fixture(params=["local", "redis"])
def transport(request: pytest.FixtureRequest) -> Transport:
    base: dict[str, Any] = {"max_queue_depth": 10, "max_queue_wait_s": 30}
    if request.param == "redis":
        redis = request.getfixturevalue("redis_server")
        base |= {
            "redis_url": redis.url, "redis_prefix": request.getfixturevalue("prefix"),
            "slots": 2, "chunk_size": 8, "heartbeat_interval_s": 0.1,
            "visibility_timeout_s": 0.5,
        }  # fmt: skip
    return Transport(request.param, base)


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 30))


async def _echo(source: JobSource, count: int) -> None:
    """A stand-in slot loop: answers ``count`` jobs with their code as stdout."""
    for _ in range(count):
        job = await source.get()
        assert job is not None
        await source.done(
            job, ExecuteResult(id=job.request.id, status=Status.ok, stdout=job.request.code)
        )


async def _held(queue: Queue, jobs: int) -> None:
    """Until ``queue`` holds ``jobs`` jobs (the Redis queue admits in its own round trip)."""
    while sum(await queue.depth()) < jobs:
        await asyncio.sleep(0.01)


def test_results_in_request_order(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open() as (queue, source):
            echo = asyncio.create_task(_echo(await source(), 8))
            results = await queue.submit([ExecuteRequest(code=str(i)) for i in range(8)])
            await echo
            assert [r.stdout for r in results] == [str(i) for i in range(8)]

    _run(main)


def test_full_queue_refuses_the_whole_batch(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open(max_queue_depth=5, retry_after_s=3) as (queue, source):
            pending = asyncio.create_task(queue.submit([ExecuteRequest(code="a")] * 4))
            await _held(queue, 4)
            with pytest.raises(QueueFull) as info:
                await queue.submit([ExecuteRequest(code="b")] * 2)
            assert (info.value.depth, info.value.limit, info.value.retry_after) == (4, 5, 3)
            assert sum(await queue.depth()) == 4  # the refused batch left nothing behind
            await _echo(await source(), 4)
            assert [r.stdout for r in await pending] == ["a"] * 4

    _run(main)


def test_deadline_passes_with_no_worker_at_all(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open(max_queue_wait_s=0.5) as (queue, _):
            started = time.monotonic()
            results = await queue.submit([ExecuteRequest(code="x")] * 5)
            assert time.monotonic() - started < 3
            assert {r.status for r in results} == {Status.queue_timeout}
            assert "not started within 0.5 s" in results[0].message
            assert sum(await queue.depth()) == 0  # answered and removed: nothing runs it

    _run(main)


def test_same_id_runs_once_then_is_answered_from_the_results_kept(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open() as (queue, source):
            request = ExecuteRequest(code="once", id="k1")
            first = asyncio.create_task(queue.submit([request]))
            second = asyncio.create_task(queue.submit([request, request]))
            await _held(queue, 1)
            await asyncio.sleep(0.1)  # the second submission joins rather than queues
            assert sum(await queue.depth()) == 1  # one job for three submissions
            await _echo(await source(), 1)
            assert [r.stdout for r in await first] == ["once"]
            assert [r.stdout for r in await second] == ["once", "once"]
            again = await queue.submit([request])  # kept: answered with no worker
            assert again[0].stdout == "once"

    _run(main)
