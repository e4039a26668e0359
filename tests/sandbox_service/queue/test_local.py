"""The in-process queue on its own: admission, order, deadlines, idempotency, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import QueueFull, QueueUnavailable, ResultCache
from sandbox_service.queue.local import LocalQueue
from sandbox_service.settings import Settings


def _settings(**overrides: object) -> Settings:
    return Settings(**{"max_queue_depth": 10, "max_queue_wait_s": 60, **overrides})


async def _echo_worker(queue: LocalQueue, count: int) -> None:
    """A stand-in consumer that answers each job with its own code as stdout."""
    for _ in range(count):
        job = await queue.get()
        assert job is not None
        await queue.done(
            job, ExecuteResult(id=job.request.id, status=Status.ok, stdout=job.request.code)
        )


def test_results_in_request_order() -> None:
    async def main() -> list[str]:
        queue = LocalQueue(_settings())
        await queue.start()
        worker = asyncio.create_task(_echo_worker(queue, 5))
        results = await queue.submit([ExecuteRequest(code=str(i)) for i in range(5)])
        await worker
        await queue.close()
        return [r.stdout for r in results]

    assert asyncio.run(main()) == ["0", "1", "2", "3", "4"]


def test_full_queue_refuses_the_whole_batch() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings(max_queue_depth=3))
        await queue.start()
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="a")] * 2))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as info:
            await queue.submit([ExecuteRequest(code="b")] * 2)
        assert info.value.depth == 2 and info.value.limit == 3
        assert await queue.depth() == (2, 0)  # the refused batch left nothing behind
        await _echo_worker(queue, 2)
        await pending
        await queue.close()

    asyncio.run(main())


def test_deadline_passes_without_any_worker() -> None:
    async def main() -> ExecuteResult:
        queue = LocalQueue(_settings(max_queue_wait_s=0.1))
        await queue.start()
        [result] = await asyncio.wait_for(queue.submit([ExecuteRequest(code="x")]), 5)
        await queue.close()
        return result

    result = asyncio.run(main())
    assert result.status is Status.queue_timeout and result.queue_time_s >= 0.1


def test_same_id_joins_running_job_and_then_hits_the_cache() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings())
        await queue.start()
        request = ExecuteRequest(code="once", id="k1")
        first = asyncio.create_task(queue.submit([request]))
        second = asyncio.create_task(queue.submit([request, request]))
        await asyncio.sleep(0)
        assert await queue.depth() == (1, 0)  # one job for three submissions
        await _echo_worker(queue, 1)
        assert [r.stdout for r in await first] == ["once"]
        assert [r.stdout for r in await second] == ["once", "once"]
        again = await queue.submit([request])  # answered from the cache, no worker needed
        assert again[0].stdout == "once"
        await queue.close()

    asyncio.run(main())


def test_shutdown_rejects_what_never_started() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings())
        await queue.start()
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="x")] * 3))
        await asyncio.sleep(0)
        queue.begin_shutdown()
        with pytest.raises(QueueUnavailable):
            await queue.submit([ExecuteRequest(code="late")])
        await queue.close()
        results = await pending
        assert [r.status for r in results] == [Status.rejected] * 3
        assert "did not run" in results[0].message
        assert await queue.get() is None

    asyncio.run(main())


def test_result_cache_expires() -> None:
    cache = ResultCache(ttl_s=0.05)
    cache.put("a", ExecuteResult(status=Status.ok))
    assert cache.get("a") is not None
    import time

    time.sleep(0.06)
    assert cache.get("a") is None
    cache.put("b", ExecuteResult(status=Status.ok))
    assert len(cache) == 1  # the expired entry was dropped on insert
