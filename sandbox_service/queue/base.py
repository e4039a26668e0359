"""The queue interface: the API submits requests and awaits results; workers take jobs.

Two faces of one transport. ``Queue`` is what an API node sees (submit a batch, wait for its
results in order, report depth); ``JobSource`` is what a worker sees (take a job, return its
result, or hand it back for another attempt). The in-process queue implements both; the Redis
queue splits them across machines. The API never knows which one it has.
"""

from __future__ import annotations

import abc
import asyncio
import math
import os
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.tenants import DEFAULT, DEFAULT_TENANT, RateLimiter, Tenant

MAX_ATTEMPTS = 2  # a job whose zygote died under it runs once more, then is answered


def node_name() -> str:
    """A process's name on the queue when none is configured: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class QueueFull(Exception):
    """Admitting the batch would exceed the queue's maximum depth (HTTP 429)."""

    def __init__(
        self, depth: int, limit: float, wanted: int, retry_after: int, message: str = ""
    ) -> None:
        self.depth, self.limit, self.wanted, self.retry_after = depth, limit, wanted, retry_after
        super().__init__(
            message
            or f"queue is full: {depth} jobs waiting or running, {wanted} more asked, "
            f"at most {limit}; retry after {retry_after} s"
        )


class QuotaExceeded(QueueFull):
    """The tenant is over one of its quotas (HTTP 429, naming it); other tenants are not.
    ``depth``, ``limit`` and ``wanted`` are the quota's own: what the tenant holds (or asked
    in the last second), the quota, what this batch asked."""

    def __init__(
        self, tenant: str, quota: str, why: str, retry_after: int, depth: int, limit: float,
        wanted: int,
    ) -> None:  # fmt: skip
        self.tenant, self.quota = tenant, quota
        message = f"tenant {tenant!r} is over its quota {quota}: {why}; retry after {retry_after} s"
        super().__init__(depth, limit, wanted, retry_after, message)


def check_queued(tenant: Tenant, held: int, fresh: int, retry_after: int) -> None:
    """Raise QuotaExceeded if ``fresh`` more jobs would take ``tenant`` over ``max_queued``."""
    if tenant.max_queued and fresh and held + fresh > tenant.max_queued:
        why = f"{held} jobs waiting or running, {fresh} more asked, at most {tenant.max_queued}"
        raise QuotaExceeded(
            tenant.name, "max_queued", why, retry_after, held, tenant.max_queued, fresh
        )


def check_rate(rates: RateLimiter, tenant: Tenant, fresh: int) -> None:
    """Take ``fresh`` executions from ``tenant``'s rate, or raise QuotaExceeded (max_rate) with
    the whole seconds until they would fit (at least 1)."""
    wait = rates.take(tenant, fresh)
    if wait:
        why = f"{fresh} executions asked, at most {tenant.max_rate:g} a second"
        retry = max(1, math.ceil(wait))
        raise QuotaExceeded(tenant.name, "max_rate", why, retry, 0, tenant.max_rate, fresh)


def scoped(tenant: str, request_id: str) -> str:
    """An idempotency key within its tenant: another tenant's same id is another job. Tenant
    names cannot hold ':', so the split is unambiguous."""
    return f"{tenant}:{request_id}"


class QueueUnavailable(Exception):
    """The queue cannot take work now: shutting down, or its backing store is unreachable
    (HTTP 503)."""


class ClientGone(Exception):
    """The submission's client went away before its answer; its work was dropped."""


@dataclass(eq=False)
class Submission:
    """What every front hands the queue: the requests, whose they are, and whether the client
    that sent them is still there (``gone`` is set when its HTTP connection closed)."""

    requests: Sequence[ExecuteRequest]
    tenant: Tenant = DEFAULT
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    start_within_s: float | None = None  # not started by then: queue_timeout (below the max)

    def part(self, requests: Sequence[ExecuteRequest]) -> Submission:
        """Other requests (some of these, or what they became) for the same tenant and client."""
        return Submission(requests, self.tenant, self.gone, self.start_within_s)

    def start_by(self, now: float, max_wait_s: float) -> float:
        """When its jobs queued at ``now`` must have started."""
        wait = max_wait_s if self.start_within_s is None else min(max_wait_s, self.start_within_s)
        return now + wait


@dataclass(eq=False)
class Job:
    request: ExecuteRequest
    enqueued_at: float  # wall clock, comparable across machines
    start_by: float  # not started by then: queue_timeout
    attempts: int = 0
    key: str = ""
    tenant: str = DEFAULT_TENANT
    charged: float = 0.0  # slot-seconds charged to its tenant when it started (queue.fair)
    started: float = 0.0  # monotonic, when a slot took it
    future: asyncio.Future[ExecuteResult] | None = field(default=None, repr=False)
    askers: int = 1  # submissions waiting for it (an id joins more)
    # Set once nobody waits for it any more: a slot does not start it, and kills it running.
    abandoned: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


def result_for(job: Job, status: Status, message: str, worker: str = "") -> ExecuteResult:
    """An answer for a job that did not (or not completely) run."""
    return ExecuteResult(
        id=job.request.id,
        status=status,
        queue_time_s=round(max(0.0, time.time() - job.enqueued_at), 6),
        worker=worker,
        message=message,
    )


DROPPED = "its client went away before the answer; it was dropped and answered to nobody"


async def answers(
    futures: Sequence[asyncio.Future[ExecuteResult]], gone: asyncio.Event
) -> list[ExecuteResult]:
    """The results of ``futures`` in order, or ClientGone as soon as ``gone`` is set. Each
    future is shielded: another submission may be waiting on the same job."""
    gathered = asyncio.gather(*(asyncio.shield(f) for f in futures))
    watch = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((gathered, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if gathered.done():
        return list(gathered.result())
    gathered.cancel()
    raise ClientGone(DROPPED)


def queue_timeout(job: Job, max_wait_s: float, worker: str = "") -> ExecuteResult:
    return result_for(
        job, Status.queue_timeout, f"not started within {max_wait_s:g} s of being queued", worker
    )


class ResultCache:
    """Results of requests that carried an ``id``, kept ``ttl_s`` seconds for re-submission."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, tuple[float, ExecuteResult]] = OrderedDict()

    def get(self, key: str) -> ExecuteResult | None:
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            return None
        return item[1]

    def put(self, key: str, result: ExecuteResult) -> None:
        if self.ttl_s <= 0:
            return
        now = time.monotonic()
        self._items[key] = (now + self.ttl_s, result)
        self._items.move_to_end(key)
        while self._items:
            oldest = next(iter(self._items.values()))
            if oldest[0] >= now:
                break
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


async def park(getters: deque[asyncio.Future[None]]) -> None:
    """Wait (cancellably) until a producer calls ``wake`` on ``getters``: how a consumer
    with nothing to take waits for work without polling."""
    getter = asyncio.get_running_loop().create_future()
    getters.append(getter)
    try:
        await getter
    except asyncio.CancelledError:
        getter.cancel()
        raise


def wake(getters: deque[asyncio.Future[None]], count: int = 1) -> int:
    """Wake up to ``count`` parked consumers; how many were woken."""
    woken = 0
    while woken < count and getters:
        getter = getters.popleft()
        if not getter.done():
            getter.set_result(None)
            woken += 1
    return woken


class Queue(abc.ABC):
    """What an API node talks to."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def run(self, submission: Submission) -> list[ExecuteResult]:
        """Run every request of ``submission``; results in request order. Raises QueueFull
        (and QuotaExceeded), QueueUnavailable, and ClientGone once ``submission.gone`` is set
        (its jobs nobody else waits for are dropped: not started, or killed running)."""

    async def submit(
        self, requests: Sequence[ExecuteRequest], tenant: Tenant = DEFAULT
    ) -> list[ExecuteResult]:
        """``run`` for a caller with no connection to lose (the CLI, tests)."""
        return await self.run(Submission(requests, tenant))

    @abc.abstractmethod
    def begin_shutdown(self) -> None:
        """Stop admitting work; what is admitted is still answered."""

    @abc.abstractmethod
    async def depth(self) -> tuple[int, int]:
        """(waiting, running)."""

    @abc.abstractmethod
    async def ready(self) -> tuple[bool, str]:
        """Whether work submitted now would be run, and if not why."""


class JobSource(Protocol):
    """What a worker talks to."""

    async def get(self) -> Job | None:
        """The next job to run, or None once the source is closed."""
        ...

    async def done(self, job: Job, result: ExecuteResult) -> None: ...

    async def retry(self, job: Job) -> None:
        """Put a job back for another attempt (its slot died under it)."""
        ...
