"""The Redis queue in one event loop against a real Redis: both faces, with stand-in workers.

The node processes are tested in ``test_redis_mode.py``, the contract shared with the local queue
in ``test_contract.py``; here what only Redis does is checked directly and fast: chunking and
round trips, idempotency across API nodes, taking over from a dead worker, a Redis that lost
its data or cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ResponseError

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import QueueUnavailable
from sandbox_service.queue.redis.connection import stop_tasks
from sandbox_service.queue.redis.keys import Keys
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.queue.redis.scripts import ADMIT
from sandbox_service.service_process import free_port
from sandbox_service.settings import Settings
from tests.sandbox_service.queue.stand_ins import (
    api_queue,
    depth_reaches,
    echo,
    redis_settings,
    run,
    started_source,
    until,
)
from tests.sandbox_service.redis_helpers import RedisServer


def test_results_in_order_in_chunks_with_few_round_trips(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = redis_settings(redis_server, prefix)

    async def main() -> None:
        queue, source = await api_queue(settings), await started_source(settings)
        trips = queue.link.round_trips + source.link.round_trips
        worker = asyncio.create_task(echo(source, 50))
        results = await queue.submit([ExecuteRequest(code=str(i)) for i in range(50)])
        await worker
        assert [r.stdout for r in results] == [str(i) for i in range(50)]
        # 7 chunks: one admission, then per chunk at most a fetch, a settle and a read (and
        # a few heartbeats and sweeps): well under one round trip per execution.
        spent = queue.link.round_trips + source.link.round_trips - trips
        assert spent < 0.75 * 50, spent
        status = await queue.cluster()
        assert [w.name for w in status.workers] == ["w1"]
        assert status.executions == {"ok": 50} and status.depth == 0
        await source.close()
        await queue.close()

    run(main)


def test_concurrent_single_requests_share_admission_round_trips(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = redis_settings(redis_server, prefix)

    async def main() -> None:
        queue = await api_queue(settings)
        await stop_tasks(queue._tasks)  # no reads or sweeps: admissions alone are counted
        await queue.link.load_scripts()
        trips = queue.link.round_trips
        pending = [asyncio.create_task(queue.submit([ExecuteRequest(code=str(i))]))
                   for i in range(40)]  # fmt: skip
        while queue.in_flight < 40:
            await asyncio.sleep(0.01)
        # sent in one turn of the loop, all 40 share one round trip
        assert queue.link.round_trips - trips == 1, queue.link.round_trips - trips
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await queue.close()

    run(main)


def test_a_script_error_is_its_callers_alone(redis_server: RedisServer, prefix: str) -> None:
    settings = redis_settings(redis_server, prefix)

    async def main() -> None:
        queue = await api_queue(settings)
        await stop_tasks(queue._tasks)  # no reads or sweeps: the calls alone are counted
        await queue.link.load_scripts()
        trips = queue.link.round_trips
        good = asyncio.create_task(queue.submit([ExecuteRequest(code="1")]))
        bad = asyncio.create_task(queue.link.script(ADMIT, [], []))  # no keys: refused
        with pytest.raises(ResponseError):
            await bad
        assert queue.link.round_trips - trips == 1  # one round trip carried both
        while queue.in_flight < 1:  # the other call in that round trip was admitted
            await asyncio.sleep(0.01)
        assert not good.done()
        good.cancel()
        await queue.close()

    run(main)


def test_an_idle_workers_wake_up_carries_its_chunk(redis_server: RedisServer,
                                                   prefix: str) -> None:  # fmt: skip
    settings = redis_settings(redis_server, prefix, slots=1)

    async def main() -> None:
        queue, source = await api_queue(settings), await started_source(settings)
        warm = asyncio.create_task(queue.submit([ExecuteRequest(code="0")]))
        await echo(source, 1)  # the worker learns of the tenant (a take of its own)
        await warm
        await asyncio.sleep(0.3)  # it found nothing more and waits on the bell
        takes, script = [], source.link.script

        async def counted(*args: Any) -> Any:
            takes.append(args[0].name)
            return await script(*args)

        source.link.script = counted  # type: ignore[method-assign,assignment]
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="1")]))
        job = await source.get()
        assert job is not None and job.request.code == "1"
        assert takes == []  # the take ran in Redis right after the wake-up, in its round trip
        await source.done(job, ExecuteResult(status=Status.ok, stdout="1"))
        assert [r.stdout for r in await pending] == ["1"]
        assert await source.link.call("llen", queue.keys.bell) == 0  # the token was spent
        await source.close()
        await queue.close()

    run(main)


def test_a_finished_chunks_settle_rides_with_the_next_take(redis_server: RedisServer,
                                                           prefix: str) -> None:  # fmt: skip
    """A job that ends frees a slot: its settle and the take that refills the slot share one
    round trip (under load: ~1 per execution on the worker, not 2)."""
    settings = redis_settings(
        redis_server, prefix, slots=1, heartbeat_interval_s=5, visibility_timeout_s=30
    )  # fmt: skip (no heartbeat in the count)

    async def main() -> None:
        queue, source = await api_queue(settings), await started_source(settings)
        first = asyncio.create_task(queue.submit([ExecuteRequest(code="a")]))
        second = asyncio.create_task(queue.submit([ExecuteRequest(code="b")]))
        a = await source.get()
        assert a is not None
        await until(lambda: len(source._unstarted) == 1)  # the next one, taken ahead
        third = asyncio.create_task(queue.submit([ExecuteRequest(code="c")]))
        await depth_reaches(queue, 3)  # c in Redis, not taken (the slot is full), a and b out
        sent: list[str] = []
        pipeline, script = source.link.pipeline, source.link.script

        async def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
            sent.append("pipeline")
            return await pipeline(*args, **kwargs)

        async def counted_script(*args: Any) -> Any:
            sent.append("script")
            return await script(*args)

        source.link.pipeline = counted_pipeline  # type: ignore[method-assign]
        source.link.script = counted_script  # type: ignore[method-assign,assignment]
        await source.done(a, ExecuteResult(status=Status.ok, stdout="a"))
        b = await source.get()  # as a slot does: at once, freeing room for one more
        assert b is not None
        assert [r.stdout for r in await first] == ["a"]
        await until(lambda: len(source._unstarted) == 1)  # "c" came with a's settle
        assert sent == ["pipeline"]
        for job, done in ((b, second), (await source.get(), third)):
            assert job is not None
            await source.done(job, ExecuteResult(status=Status.ok, stdout=job.request.code))
            assert [r.stdout for r in await done] == [job.request.code]
        await source.close()
        await queue.close()

    run(main)


def test_same_id_runs_once_across_api_nodes(redis_server: RedisServer, prefix: str) -> None:
    settings = redis_settings(redis_server, prefix)

    async def main() -> None:
        a, b = await api_queue(settings), await api_queue(settings)
        request = ExecuteRequest(code="once", id="k1")
        first = asyncio.create_task(a.submit([request, request]))
        second = asyncio.create_task(b.submit([request]))
        await depth_reaches(a, 1)  # the first in Redis; then time for the others to join it
        await asyncio.sleep(0.2)
        assert (await a.cluster()).depth == 1  # three submissions, one job
        source = await started_source(settings)
        await echo(source, 1)
        assert [r.stdout for r in await first] == ["once", "once"]
        assert [r.stdout for r in await second] == ["once"]
        again = await b.submit([request])  # stored: answered with no worker
        assert again[0].stdout == "once" and (await b.cluster()).executions == {"ok": 1}
        for closing in (source.close(), a.close(), b.close()):
            await closing

    run(main)


def test_chunks_of_a_dead_worker_are_taken_over_job_by_job(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = redis_settings(redis_server, prefix, max_attempts=2, chunk_size=4)

    async def main() -> None:
        queue = await api_queue(settings)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code=str(i)) for i in range(4)]))
        dead = await started_source(settings, "dead")
        job = await dead.get()  # it takes the chunk, starts a job, and dies
        assert job is not None
        await dead.vanish()
        survivor = await started_source(settings, "survivor")
        await echo(survivor, 4, "survivor")
        results = await pending
        assert [r.stdout for r in results] == ["0", "1", "2", "3"]
        assert {r.worker for r in results} == {"survivor"}
        assert (await queue.cluster()).reclaimed == 4
        await survivor.close()
        # A job whose worker vanishes every time: after max_attempts, answered, not run.
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="poison")]))
        doomed = []
        for name in ("dead2", "dead3"):
            doomed.append(await started_source(settings, name))
            job = await doomed[-1].get()
            assert job is not None and job.request.code == "poison"
            await doomed[-1].vanish()
        last = await started_source(settings, "last")
        [result] = await pending  # answered by the last worker's heartbeat
        assert result.status is Status.internal_error
        assert "vanished 2 times" in result.message and "max_attempts=2" in result.message
        assert (await queue.cluster()).depth == 0
        await last.close()
        await queue.close()
        for source in (dead, *doomed):
            await source.link.close()

    run(main)


def test_stopping_worker_hands_back_what_it_had_not_started(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = redis_settings(redis_server, prefix, visibility_timeout_s=30)

    async def main() -> None:
        queue = await api_queue(settings)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code=str(i)) for i in range(8)]))
        leaving = await started_source(settings, "leaving")
        job = await leaving.get()
        assert job is not None
        leaving.stop_taking()
        await leaving.done(job, ExecuteResult(status=Status.ok, stdout=job.request.code))
        await leaving.close()
        staying = await started_source(settings, "staying")
        await echo(staying, 7)  # well before the visibility timeout: handed back, not reclaimed
        assert [r.stdout for r in await pending] == [str(i) for i in range(8)]
        status = await queue.cluster()
        assert status.reclaimed == 0 and [w.name for w in status.workers] == ["staying"]
        await staying.close()
        await queue.close()

    run(main)


def test_redis_that_lost_its_data_is_noticed(redis_server: RedisServer, prefix: str) -> None:
    settings = redis_settings(redis_server, prefix)

    async def main() -> None:
        queue = await api_queue(settings)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="x")] * 3))
        await asyncio.sleep(0.2)
        keys = Keys(prefix)
        await queue.link.client.delete(keys.jobs, keys.depth, keys.epoch)  # as a restart would
        results = await pending
        assert {r.status for r in results} == {Status.rejected}
        assert "lost the queue" in results[0].message
        await queue.close()

    run(main)


def test_unreachable_redis_is_an_explicit_error() -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_prefix="none")

    async def main() -> None:
        queue = RedisQueue(settings, Metrics())
        await queue.start()
        started = time.monotonic()
        with pytest.raises(QueueUnavailable, match="queue is unreachable"):
            await queue.submit([ExecuteRequest(code="x")])
        ok, why = await queue.ready()
        assert not ok and "Redis at redis://127.0.0.1" in why
        assert time.monotonic() - started < 5
        await queue.close()

    run(main)


def test_background_loops_survive_an_unexpected_error(
    redis_server: RedisServer, prefix: str
) -> None:
    """A loop that died silently would leave requests waiting until their clients gave up."""
    settings = redis_settings(redis_server, prefix, max_queue_wait_s=0.3)

    async def main() -> None:
        queue = await api_queue(settings)
        real, failed = queue.sweep, list[bool]()

        async def sweep_failing_once() -> None:
            if not failed:
                failed.append(True)
                raise RuntimeError("a bug")
            await real()

        queue.sweep = sweep_failing_once  # type: ignore[method-assign]
        results = await queue.submit([ExecuteRequest(code="x")] * 2)
        assert failed and {r.status for r in results} == {Status.queue_timeout}
        await queue.close()

    run(main)


def test_sweep_survives_a_restart_noticed_by_a_submit_meanwhile(
    redis_server: RedisServer, prefix: str
) -> None:
    """A submit that sees a new epoch forgets every chunk while a sweep waits on Redis; the
    sweep then finds the chunk it settled gone (a KeyError once, which killed the loop)."""
    settings = redis_settings(redis_server, prefix, max_queue_wait_s=0.3)

    async def main() -> None:
        queue = await api_queue(settings)
        await stop_tasks(queue._tasks)  # this test sweeps by hand
        source = await started_source(settings)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code="x")] * 2))
        assert await source.get() is not None  # a worker took the chunk and holds it
        await asyncio.sleep(0.4)  # past its start-by time: due, but delivered
        real = queue.link.pipeline

        async def restart_noticed_meanwhile(
            fill: Callable[..., object], each: bool = False
        ) -> list[Any]:
            results = await real(fill, each)
            queue._lost_everything()  # what a submit that saw a new epoch does
            return results

        queue.link.pipeline = restart_noticed_meanwhile  # type: ignore[method-assign]
        await queue.sweep()
        results = await pending
        assert {r.status for r in results} == {Status.rejected}
        await source.close()
        await queue.close()

    run(main)


def test_a_second_restart_is_noticed_when_the_same_node_reaches_redis_first(
    own_redis: RedisServer, prefix: str
) -> None:
    """Each epoch is a fresh value: when node A sets it after two restarts in a row, node B
    must still see the second one (with a value per node, it saw the same epoch again and
    waited for ever on what the restart lost; found by the fault soak)."""
    settings = redis_settings(own_redis, prefix)

    async def restart_and_sweep_a_first(a: RedisQueue, b: RedisQueue) -> None:
        await asyncio.to_thread(own_redis.stop)
        await asyncio.to_thread(own_redis.start)
        with contextlib.suppress(QueueUnavailable):
            await a.sweep()  # A is first: the epoch in the new Redis is A's offer
        await a.sweep()

    async def main() -> None:
        a = await api_queue(settings)
        b = await api_queue(settings)
        for task in (*a._tasks, *b._tasks):
            task.cancel()  # this test sweeps by hand, A first
        for restart in range(2):
            pending = asyncio.create_task(b.submit([ExecuteRequest(code="x")]))
            await asyncio.sleep(0.2)  # admitted; no worker takes it
            await restart_and_sweep_a_first(a, b)
            with contextlib.suppress(QueueUnavailable):
                await b.sweep()
            await b.sweep()
            [result] = await asyncio.wait_for(pending, 5)
            assert result.status is Status.rejected, restart
            assert "lost the queue" in result.message
        await a.close()
        await b.close()

    run(main)
