"""Stand-ins the queue tests share: a slot loop that echoes, and Redis-queue faces started
against a test's own Redis and key prefix."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.queue.base import JobSource
from sandbox_service.queue.redis.consumer import RedisJobSource
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.settings import Settings
from tests.sandbox_service.redis_helpers import RedisServer


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 30))


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0,
                what: str = "timed out waiting") -> None:  # fmt: skip
    """Poll ``condition`` (a function, or an async one) until it holds; asserts it did within
    ``timeout_s``, saying ``what``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await _holds(condition):
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def _holds(condition: Callable[[], bool | Awaitable[bool]]) -> bool:
    held = condition()
    return await held if inspect.isawaitable(held) else held


async def depth_reaches(queue: RedisQueue, depth: int) -> None:
    """Wait until the cluster holds ``depth`` unsettled jobs (a submission is in Redis)."""

    async def reached() -> bool:
        return (await queue.cluster()).depth >= depth

    await until(reached, what=f"the cluster's depth never reached {depth}")


async def echo(source: JobSource, count: int, name: str = "echo") -> None:
    """A stand-in slot loop: answers ``count`` jobs with their code as stdout."""
    for _ in range(count):
        job = await source.get()
        assert job is not None
        await source.done(job, ExecuteResult(id=job.request.id, status=Status.ok,
                                             stdout=job.request.code, worker=name))  # fmt: skip


def redis_settings(redis: RedisServer, prefix: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": redis.url, "redis_prefix": prefix, "slots": 2, "chunk_size": 8,
        "heartbeat_interval_s": 0.1, "visibility_timeout_s": 0.5, "max_queue_wait_s": 30,
    }  # fmt: skip
    return Settings(**{**base, **overrides})


async def started_source(settings: Settings, name: str = "w1") -> RedisJobSource:
    source = RedisJobSource(settings, Metrics(), name)
    await source.start(lambda: {"slots": settings.slots, "busy": 0, "executions": 0})
    return source


async def api_queue(settings: Settings) -> RedisQueue:
    queue = RedisQueue(settings, Metrics())
    await queue.start()
    return queue
