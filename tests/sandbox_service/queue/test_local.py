"""The in-process queue on its own: shutdown, the results kept, tenants; the contract it shares
with the Redis queue is tested in ``test_contract.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import QueueUnavailable, QuotaExceeded, ResultCache
from sandbox_service.queue.local import LocalQueue
from sandbox_service.settings import Settings
from sandbox_service.tenants import Tenant
from tests.sandbox_service.queue.stand_ins import echo


def _settings(**overrides: Any) -> Settings:
    return Settings(**{"max_queue_depth": 10, "max_queue_wait_s": 60, **overrides})


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


# ---------------------------------------------------------------- tenants


async def _slot(queue: LocalQueue, used: dict[str, float], stop: asyncio.Event) -> None:
    """A stand-in slot: runs each job for the seconds its code names, books its slot time."""
    while not stop.is_set():
        job = await queue.get()
        if job is None:
            return
        await asyncio.sleep(float(job.request.code))
        used[job.tenant] = used.get(job.tenant, 0.0) + float(job.request.code)
        await queue.done(job, ExecuteResult(status=Status.ok, stdout=job.tenant))


def test_same_id_of_two_tenants_is_two_jobs() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings())
        await queue.start()
        request = ExecuteRequest(code="x", id="shared")
        a = asyncio.create_task(queue.submit([request], Tenant("a")))
        b = asyncio.create_task(queue.submit([request], Tenant("b")))
        await asyncio.sleep(0)
        assert await queue.depth() == (2, 0)
        for _ in range(2):
            job = await queue.get()
            assert job is not None
            await queue.done(job, ExecuteResult(status=Status.ok, stdout=job.tenant))
        assert [r.stdout for r in await a] == ["a"] and [r.stdout for r in await b] == ["b"]
        again = await queue.submit([request], Tenant("b"))  # stored: b's own
        assert again[0].stdout == "b"
        await queue.close()

    asyncio.run(main())


def test_slot_time_goes_by_weight_whatever_the_jobs_cost() -> None:
    """Both tenants always have work; a's jobs run 4x longer than b's, b weighs 3x more."""

    async def main() -> dict[str, float]:
        settings = _settings(max_queue_depth=10_000, slots=2, tenant_reserve_slots=0)
        queue = LocalQueue(settings)
        await queue.start()
        a = asyncio.create_task(queue.submit([ExecuteRequest(code="0.02")] * 200, Tenant("a")))
        b = asyncio.create_task(
            queue.submit([ExecuteRequest(code="0.005")] * 2000, Tenant("b", weight=3))
        )
        used: dict[str, float] = {}
        stop = asyncio.Event()
        slots = [asyncio.create_task(_slot(queue, used, stop)) for _ in range(2)]
        await asyncio.sleep(1.5)
        stop.set()
        shares = dict(used)
        await queue.close()
        await asyncio.gather(a, b, *slots)
        return shares

    used = asyncio.run(main())
    share_b = used["b"] / (used["a"] + used["b"])
    assert 0.65 < share_b < 0.85, used  # 0.75 by weight; by job count it would be ~0.94


def test_max_in_flight_caps_a_tenant_and_max_queued_refuses_it_alone() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings(slots=4, tenant_reserve_slots=0))
        await queue.start()
        capped = Tenant("capped", max_in_flight=1, max_queued=3)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="c")] * 3, capped))
        await asyncio.sleep(0)
        with pytest.raises(QuotaExceeded, match="quota max_queued: 3 jobs waiting or running"):
            await queue.submit([ExecuteRequest(code="more")], capped)
        other = asyncio.create_task(queue.submit([ExecuteRequest(code="o")], Tenant("other")))
        await asyncio.sleep(0)
        first = await queue.get()
        assert first is not None and first.tenant == "capped"
        second = await queue.get()  # the capped tenant holds its one slot: the other goes
        assert second is not None and second.tenant == "other"
        assert queue.tenant_counts() == {"capped": (2, 1), "other": (0, 1)}
        for job in (first, second):
            await queue.done(job, ExecuteResult(status=Status.ok))
        await other
        await echo(queue, 2)
        assert len(await pending) == 3
        await queue.close()

    asyncio.run(main())


def test_a_flood_leaves_a_slot_to_a_tenant_that_was_active_just_now() -> None:
    async def main() -> None:
        queue = LocalQueue(_settings(slots=2, tenant_reserve_slots=1))
        await queue.start()
        light, flood = Tenant("light"), Tenant("flood")
        first = asyncio.create_task(queue.submit([ExecuteRequest(code="l")], light))
        await echo(queue, 1)
        await first
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="f")] * 4, flood))
        await asyncio.sleep(0)
        taken = await queue.get()
        assert taken is not None and taken.tenant == "flood"
        getter = asyncio.create_task(queue.get())
        await asyncio.sleep(0.05)
        assert not getter.done()  # the second slot waits for the light tenant
        light_again = asyncio.create_task(queue.submit([ExecuteRequest(code="l2")], light))
        job = await asyncio.wait_for(getter, 1)
        assert job is not None and job.tenant == "light"
        await queue.done(job, ExecuteResult(status=Status.ok))
        await queue.done(taken, ExecuteResult(status=Status.ok))
        await light_again
        await echo(queue, 3)
        await pending
        await queue.close()

    asyncio.run(main())
