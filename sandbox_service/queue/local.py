"""The in-process queue of the embedded mode: API handlers and slot workers in one event loop.

Bounded (a batch that would exceed ``max_queue_depth`` is refused whole, so the caller can
retry it whole), first in first out, with deadlines: a job not started within
``max_queue_wait_s`` is answered ``queue_timeout`` by the expiry task even when no slot is free
to notice it. Requests with an ``id`` are idempotent: a repeated id joins the running job or
gets the stored result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import (
    Job,
    Queue,
    QueueFull,
    QueueUnavailable,
    ResultCache,
    park,
    queue_timeout,
    result_for,
    wake,
)
from sandbox_service.settings import Settings


class LocalQueue(Queue):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._waiting: deque[Job] = deque()
        self._running = 0
        self._getters: deque[asyncio.Future[None]] = deque()
        self._by_id: dict[str, Job] = {}
        self._results = ResultCache(settings.result_ttl_s)
        self._closing = False
        self._closed = False
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire(), name="queue-expiry")

    # ------------------------------------------------------------- producer face

    def _admit(self, requests: Sequence[ExecuteRequest]) -> list[asyncio.Future[ExecuteResult]]:
        loop = asyncio.get_running_loop()
        now = time.time()
        futures: list[asyncio.Future[ExecuteResult]] = []
        fresh: list[Job] = []
        for request in requests:
            key = request.id
            cached = self._results.get(key) if key is not None else None
            joined = self._by_id.get(key) if key is not None else None
            if cached is not None:
                done: asyncio.Future[ExecuteResult] = loop.create_future()
                done.set_result(cached)
                futures.append(done)
            elif joined is not None and joined.future is not None:
                futures.append(joined.future)
            else:
                job = Job(request, now, now + self.settings.max_queue_wait_s)
                job.future = loop.create_future()
                if key is not None:
                    self._by_id[key] = job
                fresh.append(job)
                futures.append(job.future)
        waiting, running = len(self._waiting), self._running
        if fresh and waiting + running + len(fresh) > self.settings.max_queue_depth:
            for job in fresh:
                if job.request.id is not None:
                    self._by_id.pop(job.request.id, None)
            raise QueueFull(
                waiting + running,
                self.settings.max_queue_depth,
                len(fresh),
                self.settings.retry_after_s,
            )
        self._waiting.extend(fresh)
        for _ in fresh:
            if not self._wake_one():
                break
        return futures

    async def submit(self, requests: Sequence[ExecuteRequest]) -> list[ExecuteResult]:
        if self._closing:
            raise QueueUnavailable("the service is shutting down and takes no new work")
        futures = self._admit(requests)
        # Shielded: a caller that goes away must not cancel a job another caller joined.
        return list(await asyncio.gather(*(asyncio.shield(f) for f in futures)))

    def begin_shutdown(self) -> None:
        self._closing = True

    def counts(self) -> tuple[int, int]:
        """(waiting, running), without awaiting: for gauges read outside the event loop's turn."""
        return len(self._waiting), self._running

    async def depth(self) -> tuple[int, int]:
        return self.counts()

    async def ready(self) -> tuple[bool, str]:
        if self._closing:
            return False, "shutting down"
        return True, ""

    # ------------------------------------------------------------- consumer face

    def _wake_one(self) -> bool:
        return wake(self._getters) == 1

    async def get(self) -> Job | None:
        while True:
            while self._waiting:
                job = self._waiting.popleft()
                if job.future is not None and job.future.done():
                    continue  # answered meanwhile (expired)
                self._running += 1
                return job
            if self._closed:
                return None
            await park(self._getters)

    async def done(self, job: Job, result: ExecuteResult) -> None:
        self._running -= 1
        self._resolve(job, result)

    async def retry(self, job: Job) -> None:
        self._running -= 1
        job.attempts += 1
        self._waiting.appendleft(job)
        self._wake_one()

    def _resolve(self, job: Job, result: ExecuteResult) -> None:
        key = job.request.id
        if key is not None:
            self._by_id.pop(key, None)
            if result.status not in (Status.rejected, Status.internal_error):
                self._results.put(key, result)
        if job.future is not None and not job.future.done():
            job.future.set_result(result)

    # ------------------------------------------------------------- lifecycle

    async def _expire(self) -> None:
        """Answer queue_timeout for jobs whose start deadline passed (FIFO: oldest first)."""
        while True:
            now = time.time()
            while self._waiting and self._waiting[0].start_by <= now:
                job = self._waiting.popleft()
                self._resolve(job, queue_timeout(job, self.settings.max_queue_wait_s))
            delay = self._waiting[0].start_by - now if self._waiting else 1.0
            await asyncio.sleep(min(max(delay, 0.01), 1.0))

    def reject_waiting(self, message: str) -> int:
        """Answer every job not yet started with ``rejected``; returns how many."""
        count = 0
        while self._waiting:
            job = self._waiting.popleft()
            self._resolve(job, result_for(job, Status.rejected, message))
            count += 1
        return count

    async def close(self) -> None:
        self._closing = self._closed = True
        self.reject_waiting("the service stopped before this request started; it did not run")
        while self._wake_one():
            pass
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
