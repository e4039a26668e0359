"""The Redis queue across a Sentinel failover, in one event loop: a real primary, replica and
three Sentinels (``sandbox_service.sentinel_process``), the primary SIGKILLed.

Loss is made certain, not left to chance: the replica is stopped and cut off first, so what
is written meanwhile exists only on the primary that then dies. What the new primary lacks is
answered ``rejected`` (lost, safe to resend) within seconds, not after every deadline; what it
has is answered normally; settlements it lacks are sent again, not run again.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import QueueUnavailable
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.sentinel_process import MASTER, SentinelGroup, available
from sandbox_service.settings import Settings
from tests.sandbox_service.queue.stand_ins import api_queue, echo, run, started_source

T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    not available(),
    reason="needs Debian's redis-server and redis-sentinel (apt-get install redis-sentinel; "
    "CI installs them)",
)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(str(tmp_path)) as g:
        yield g


def sentinel_settings(group: SentinelGroup, prefix: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": "redis://unused:1/0", "redis_sentinels": group.addresses,
        "redis_sentinel_master": MASTER, "redis_prefix": prefix, "slots": 2, "chunk_size": 8,
        "heartbeat_interval_s": 0.1, "max_queue_wait_s": 30,
        # Far beyond the test's 30 s: nothing here may be rescued by a take-over or a deadline.
        "visibility_timeout_s": 60,
    }  # fmt: skip
    return Settings(**{**base, **overrides})


async def retried(call: Callable[[], Awaitable[T]]) -> T:
    """``call`` again while Redis is unreachable (503), as a client would: just after a
    promotion a Sentinel may still answer that it knows no primary."""
    for _ in range(100):
        try:
            return await call()
        except QueueUnavailable:
            await asyncio.sleep(0.1)
    return await call()


async def lose_what_follows(group: SentinelGroup) -> Any:
    """Stop the replica and cut it off: what is written next lives only on the primary."""
    replica = next(s for s in group.servers if s.port != group.primary_port())
    assert replica.process is not None
    replica.process.send_signal(signal.SIGSTOP)
    await asyncio.to_thread(group.cut_replicas)
    return replica


async def fail_over(group: SentinelGroup, replica: Any) -> None:
    """SIGKILL the primary, let the stopped replica go on, wait for its promotion."""
    old = group.primary_port()
    await asyncio.to_thread(group.kill_primary)
    replica.process.send_signal(signal.SIGCONT)
    await asyncio.to_thread(group.wait_promoted, old)


def test_failover_answers_what_the_new_primary_lacks_rejected(
    group: SentinelGroup, prefix: str
) -> None:
    settings = sentinel_settings(group, prefix)

    async def main() -> None:
        queue = await api_queue(settings)
        kept = asyncio.create_task(queue.submit([ExecuteRequest(code=f"k{i}") for i in range(3)]))
        await asyncio.sleep(0.3)  # admitted and replicated; no worker yet
        replica = await lose_what_follows(group)
        lost = asyncio.create_task(
            queue.submit([ExecuteRequest(code="lost", id=f"lost-{i}") for i in range(4)])
        )
        await asyncio.sleep(0.3)  # admitted on the primary alone
        await fail_over(group, replica)
        # Answered by the API node once it sees the new primary, not after any deadline.
        results = await asyncio.wait_for(lost, 15)
        assert {r.status for r in results} == {Status.rejected}
        assert all("lost this request in a failover" in r.message for r in results)
        assert [r.id for r in results] == [f"lost-{i}" for i in range(4)]
        assert queue.lost._value.get() == 4 and queue.link.lost_writes._value.get() >= 1
        # What the new primary has runs, on a worker that follows it too.
        source = await started_source(settings)
        worker = asyncio.create_task(echo(source, 3 + 4))
        assert [r.stdout for r in await kept] == ["k0", "k1", "k2"]
        # An id the failover lost means nothing any more: sent again, it runs.
        again = await retried(lambda: queue.submit(
            [ExecuteRequest(code=f"again{i}", id=f"lost-{i}") for i in range(4)]))  # fmt: skip
        assert [r.stdout for r in again] == [f"again{i}" for i in range(4)]
        await worker
        assert (await retried(queue.cluster)).depth == 0
        await source.close()
        await queue.close()

    run(main)


def test_settlements_a_failover_lost_are_sent_again_not_run_again(
    group: SentinelGroup, prefix: str
) -> None:
    settings = sentinel_settings(group, prefix)

    async def main() -> None:
        queue, source = await api_queue(settings), await started_source(settings)
        pending = asyncio.create_task(queue.submit([ExecuteRequest(code=f"s{i}")
                                                    for i in range(2)]))  # fmt: skip
        jobs = [await source.get(), await source.get()]  # one chunk, taken
        await asyncio.sleep(0.3)  # the take replicated
        replica = await lose_what_follows(group)
        for job in jobs:
            assert job is not None
            await source.done(job, ExecuteResult(status=Status.ok, stdout=job.request.code))
        assert [r.stdout for r in await pending] == ["s0", "s1"]  # from the doomed primary
        await fail_over(group, replica)
        # The new primary had the chunk held and unsettled: the worker settles it again
        # (no take-over: the visibility timeout is 60 s, and nothing runs twice).
        for _ in range(200):
            cluster = await retried(queue.cluster)
            if cluster.depth == 0:
                break
            await asyncio.sleep(0.1)
        assert cluster.depth == 0 and cluster.reclaimed == 0
        assert source.link.lost_writes._value.get() >= 1
        after = await asyncio.gather(
            retried(lambda: queue.submit([ExecuteRequest(code="after")])), echo(source, 1)
        )
        assert after[0][0].stdout == "after"
        await source.close()
        await queue.close()

    run(main)


def test_a_replica_is_never_written_to(group: SentinelGroup, prefix: str) -> None:
    """A node pointed at a replica (a stale address, a demoted primary) refuses work as an
    outage (503, retried), and drops its connections to it."""
    replica = next(s for s in group.servers if s.port != group.primary_port())
    settings = Settings(redis_url=replica.url, redis_prefix=prefix)

    async def main() -> None:
        queue = RedisQueue(settings, Metrics())
        with pytest.raises(QueueUnavailable, match="read only replica"):
            await queue.submit([ExecuteRequest(code="x")])
        assert not queue.link.reachable
        await queue.link.close()

    run(main)
