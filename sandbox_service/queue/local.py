"""The in-process queue of the embedded mode: API handlers and slot workers in one event loop.

Bounded (a batch that would exceed ``max_queue_depth``, or its tenant's ``max_queued``, is
refused whole, so the caller can retry it whole), first in first out within a tenant and
weighted-fair across tenants (``queue.fair``), with deadlines: a job not started within
``max_queue_wait_s`` is answered ``queue_timeout`` by the expiry task even when no slot is free
to notice it. Requests with an ``id`` are idempotent within their tenant: a repeated id joins
the running job or gets the stored result; another tenant's same id is another job.

Latency beside a flood: a tenant beyond its weighted share of the slots does not take the last
``tenant_reserve_slots`` free ones while another tenant that is under its share has been
active in the last ``tenant_active_window_s``. Without it a light tenant's request waits for
a slot until one of the flood's long programs ends; with it, the flood gives up that many slots
for as long as the light tenant keeps coming. With one tenant (auth off) none of this applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.queue.base import (
    DROPPED,
    ClientGone,
    Job,
    Queue,
    QueueFull,
    QueueUnavailable,
    ResultCache,
    Submission,
    answers,
    check_queued,
    check_rate,
    park,
    queue_timeout,
    result_for,
    scoped,
    wake,
)
from sandbox_service.queue.fair import FairShare
from sandbox_service.settings import Settings
from sandbox_service.tenants import RateLimiter, Tenant


class LocalQueue(Queue):
    def __init__(
        self,
        settings: Settings,
        cannot_run: Callable[[], str | None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._cannot_run = cannot_run  # why nothing admitted now could run, if so
        self._waiting: dict[str, deque[Job]] = {}  # tenant -> its jobs not started (non-empty)
        self._queued = 0
        self._running = 0
        self._running_of: Counter[str] = Counter()
        self._tenants: dict[str, Tenant] = {}
        self._active_at: dict[str, float] = {}
        self._fair = FairShare()
        self._rates = RateLimiter()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._by_id: dict[str, Job] = {}
        self._results = ResultCache(settings.result_ttl_s)
        self._closing = False
        self._closed = False
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire(), name="queue-expiry")

    # ------------------------------------------------------------- producer face

    def _check(self, tenant: Tenant, fresh: int) -> None:
        """Refuse the batch (whole) if it breaks a quota or the queue's depth."""
        held = len(self._waiting.get(tenant.name, ())) + self._running_of[tenant.name]
        check_queued(tenant, held, fresh, self.settings.retry_after_s)
        waiting, running = self._queued, self._running
        if fresh and waiting + running + fresh > self.settings.max_queue_depth:
            raise QueueFull(
                waiting + running,
                self.settings.max_queue_depth,
                fresh,
                self.settings.retry_after_s,
            )
        check_rate(self._rates, tenant, fresh)

    def _admit(
        self, submission: Submission
    ) -> tuple[list[asyncio.Future[ExecuteResult]], list[Job]]:
        """Each request's future, and the jobs they wait on (each once)."""
        loop = asyncio.get_running_loop()
        requests, tenant = submission.requests, submission.tenant
        now = time.time()
        start_by = submission.start_by(now, self.settings.max_queue_wait_s)
        futures: list[asyncio.Future[ExecuteResult]] = []
        fresh: list[Job] = []
        joined_jobs: list[Job] = []
        for request in requests:
            key = scoped(tenant.name, request.id) if request.id is not None else None
            cached = self._results.get(key) if key is not None else None
            joined = self._by_id.get(key) if key is not None else None
            if cached is not None:
                done: asyncio.Future[ExecuteResult] = loop.create_future()
                done.set_result(cached)
                futures.append(done)
            elif joined is not None and joined.future is not None:
                futures.append(joined.future)
                if joined not in joined_jobs and joined not in fresh:
                    joined_jobs.append(joined)
            else:
                job = Job(request, now, start_by, tenant=tenant.name)
                job.key = key or ""
                job.future = loop.create_future()
                if key is not None:
                    self._by_id[key] = job
                fresh.append(job)
                futures.append(job.future)
        try:
            self._check(tenant, len(fresh))
        except QueueFull:
            for job in fresh:
                if job.key:
                    self._by_id.pop(job.key, None)
            raise
        if fresh:
            self._enqueue(tenant, fresh)
        for job in joined_jobs:
            job.askers += 1
        return futures, fresh + joined_jobs

    def _enqueue(self, tenant: Tenant, jobs: list[Job]) -> None:
        self._tenants[tenant.name] = tenant
        self._active_at[tenant.name] = time.monotonic()
        waiting = self._waiting.get(tenant.name)
        if waiting is None:
            waiting = self._waiting[tenant.name] = deque()
            self._fair.activate(tenant.name)
        waiting.extend(jobs)
        self._queued += len(jobs)
        wake(self._getters, len(jobs))

    async def run(self, submission: Submission) -> list[ExecuteResult]:
        if self._closing:
            raise QueueUnavailable("the service is shutting down and takes no new work")
        broken = self._cannot_run()
        if broken:
            raise QueueUnavailable(broken)
        if submission.gone.is_set():
            raise ClientGone(DROPPED)
        futures, jobs = self._admit(submission)
        try:
            return await answers(futures, submission.gone)
        except ClientGone:
            self.abandon(jobs)
            raise

    def abandon(self, jobs: Sequence[Job]) -> None:
        """A submission's client went away: each of its jobs no other submission waits for is
        dropped if it has not started, and killed if running without an ``id`` (a result
        with an id is kept for a client that asks again)."""
        dropped: set[str] = set()
        for job in jobs:
            job.askers -= 1
            if job.askers > 0 or job.future is None or job.future.done():
                continue
            if job.started:
                if not job.key:
                    job.abandoned.set()  # the slot loop kills it and counts it
                continue
            job.abandoned.set()
            if job.key:
                self._by_id.pop(job.key, None)
            job.future.set_result(result_for(job, Status.rejected, DROPPED))
            dropped.add(job.tenant)
        count = 0
        for name in dropped:
            waiting = self._waiting.get(name)
            if waiting is None:
                continue
            kept = deque(job for job in waiting if not job.abandoned.is_set())
            count += len(waiting) - len(kept)
            if kept:
                self._waiting[name] = kept
            else:
                del self._waiting[name]
        self._queued -= count
        if count:
            self.metrics.drop("queued", count)

    def begin_shutdown(self) -> None:
        self._closing = True

    def counts(self) -> tuple[int, int]:
        """(waiting, running), without awaiting: for gauges read outside the event loop's turn."""
        return self._queued, self._running

    def tenant_counts(self) -> dict[str, tuple[int, int]]:
        """(waiting, running) per tenant that has either."""
        names = set(self._waiting) | {t for t, n in self._running_of.items() if n}
        return {t: (len(self._waiting.get(t, ())), self._running_of[t]) for t in names}

    async def depth(self) -> tuple[int, int]:
        return self.counts()

    async def ready(self) -> tuple[bool, str]:
        if self._closing:
            return False, "shutting down"
        return True, ""

    # ------------------------------------------------------------- consumer face

    def _recent(self, now: float) -> list[str]:
        window = self.settings.tenant_active_window_s
        return [
            name
            for name, at in self._active_at.items()
            if name in self._waiting or self._running_of[name] or now - at < window
        ]

    def _eligible(self, name: str, recent: list[str]) -> bool:
        """May ``name`` start one more job now (its ``max_in_flight``, and the reserve)?"""
        tenant, running = self._tenants[name], self._running_of[name]
        if tenant.max_in_flight and running >= tenant.max_in_flight:
            return False
        reserve = self.settings.tenant_reserve_slots
        if reserve <= 0 or len(recent) <= 1:
            return True
        slots = self.settings.slots
        weights = sum(self._tenants[u].weight for u in recent)
        if running + 1 <= slots * tenant.weight / weights:
            return True  # within its share
        unused = sum(
            max(0, math.ceil(slots * self._tenants[u].weight / weights) - self._running_of[u])
            for u in recent
            if u != name
        )
        return slots - self._running - 1 >= min(reserve, unused)

    def _next_tenant(self) -> str | None:
        if len(self._active_at) == 1:  # one tenant ever (auth off): plain FIFO
            name = next(iter(self._waiting))
            return name if self._eligible(name, [name]) else None
        recent = self._recent(time.monotonic())
        return self._fair.pick(n for n in self._waiting if self._eligible(n, recent))

    def _take(self) -> Job | None:
        name = self._next_tenant() if self._queued else None
        if name is None:
            return None
        waiting = self._waiting[name]
        job = waiting.popleft()
        if not waiting:
            del self._waiting[name]
        self._queued -= 1
        self._running += 1
        self._running_of[name] += 1
        job.charged = self._fair.charge(name, self._tenants[name].weight)
        job.started = time.monotonic()
        return job

    async def get(self) -> Job | None:
        while True:
            job = self._take()
            if job is not None:
                return job
            if self._closed:
                return None
            await park(self._getters)

    def _finished(self, job: Job) -> None:
        self._running -= 1
        self._running_of[job.tenant] -= 1
        now = time.monotonic()
        self._active_at[job.tenant] = now
        weight = self._tenants[job.tenant].weight
        self._fair.settle(job.tenant, weight, 1, job.charged, now - job.started)
        if self._queued and self._getters:  # a capped or reserved tenant may go on now
            wake(self._getters, 1)

    async def done(self, job: Job, result: ExecuteResult) -> None:
        self._finished(job)
        self._resolve(job, result)

    async def retry(self, job: Job) -> None:
        self._finished(job)
        job.attempts += 1
        waiting = self._waiting.get(job.tenant)
        if waiting is None:
            waiting = self._waiting[job.tenant] = deque()
            self._fair.activate(job.tenant)
        waiting.appendleft(job)
        self._queued += 1
        wake(self._getters, 1)

    def _resolve(self, job: Job, result: ExecuteResult) -> None:
        if job.key:
            self._by_id.pop(job.key, None)
            if result.status not in (Status.rejected, Status.internal_error):
                self._results.put(job.key, result)
        if job.future is not None and not job.future.done():
            job.future.set_result(result)

    # ------------------------------------------------------------- lifecycle

    def _pop_expired(self, now: float) -> float:
        """Answer queue_timeout for jobs whose start deadline passed (each tenant's queue is
        FIFO: oldest first); returns the seconds until the next deadline."""
        delay = 1.0
        for name in list(self._waiting):
            waiting = self._waiting[name]
            while waiting and waiting[0].start_by <= now:
                job = waiting.popleft()
                self._queued -= 1
                self._resolve(job, queue_timeout(job, self.settings.max_queue_wait_s))
            if waiting:
                delay = min(delay, waiting[0].start_by - now)
            else:
                del self._waiting[name]
        return delay

    async def _expire(self) -> None:
        while True:
            delay = self._pop_expired(time.time())
            if self._queued and self._getters and len(self._active_at) > 1:
                wake(self._getters, len(self._getters))  # an active window may have closed
            self._forget_idle(time.monotonic())
            await asyncio.sleep(min(max(delay, 0.01), 1.0))

    def _forget_idle(self, now: float) -> None:
        """Tenants idle for long leave the scheduler's tables (their virtual time stays)."""
        horizon = max(60.0, 10 * self.settings.tenant_active_window_s)
        for name, at in list(self._active_at.items()):
            if now - at > horizon and name not in self._waiting and not self._running_of[name]:
                del self._active_at[name]
                self._running_of.pop(name, None)

    def reject_waiting(self, message: str) -> int:
        """Answer every job not yet started with ``rejected``; returns how many."""
        count = 0
        for waiting in self._waiting.values():
            while waiting:
                job = waiting.popleft()
                self._resolve(job, result_for(job, Status.rejected, message))
                count += 1
        self._waiting.clear()
        self._queued = 0
        return count

    async def close(self) -> None:
        self._closing = self._closed = True
        self.reject_waiting("the service stopped before this request started; it did not run")
        while wake(self._getters) == 1:
            pass
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
