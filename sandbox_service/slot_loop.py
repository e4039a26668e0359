"""The slot loop: each slot takes jobs from a source, runs them, and hands back results.

The same loop serves the embedded mode (source: the in-process queue) and worker nodes
(source: Redis). One task per slot, so a slot that is restarting takes no jobs and the
others carry on. Every job taken is answered: run, ``queue_timeout`` if its start deadline
passed, retried once if its zygote died under it, ``internal_error`` after that, or
``killed`` if the worker is stopped before it finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sandbox_service.cores import Cores, MemoryBudget
from sandbox_service.executor.compiler import Compiled, Compiler
from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.protocol import Limits, Outcome, RunSpec, RunStatus
from sandbox_service.executor.slot import CanaryFailed, Slot, SlotCrashed, SlotStartError
from sandbox_service.metrics import Metrics
from sandbox_service.models import CompileResult, ExecuteResult, Status
from sandbox_service.queue.base import (
    DROPPED,
    MAX_ATTEMPTS,
    Job,
    JobSource,
    queue_timeout,
    result_for,
)
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
INTERRUPT_WAIT_S = 5.0  # for a zygote to answer a run whose child was killed; then it is killed


def restart_backoff(failures: int) -> float:
    """Seconds to wait before the next restart of a slot that failed ``failures`` times in a
    row: none for a zygote that merely died, then 0.5, 1, 2, ... up to ``MAX_BACKOFF_S``."""
    return 0.0 if failures <= 0 else min(MAX_BACKOFF_S, 0.5 * 2 ** (failures - 1))


def zygote_request(job: Job) -> RunSpec[str]:
    """The executor's view of a request: what to run and under which limits, nothing else."""
    r = job.request
    limits = Limits(timeout_s=r.timeout_s, memory_mb=r.memory_mb)
    return RunSpec(code=r.code, stdin=r.stdin, mode=r.mode, files=r.files, limits=limits,
                   language=r.language)  # fmt: skip


def compile_result(compiled: Compiled | None) -> CompileResult | None:
    if compiled is None:
        return None
    b = compiled.build
    return CompileResult(status=Status(b.status.value), exit_code=b.exit_code, signal=b.signal,
                         stdout=b.stdout,
                         stderr=b.stderr, wall_time_s=b.wall_time_s, cached=compiled.cached,
                         message=b.message)  # fmt: skip


class SlotLoop:
    """One task per slot taking jobs from ``source``, and one per zygote keeping it healthy."""

    def __init__(
        self, pool: SlotPool, source: JobSource, settings: Settings, metrics: Metrics, name: str
    ) -> None:
        self.pool = pool
        self.source = source
        self.settings = settings
        self.metrics = metrics
        self.name = name
        self.executions = 0
        self.cores = Cores(settings.cores, settings.straggler_after_s)
        self.memory = MemoryBudget(settings.memory_budget())
        self.compiler = Compiler(settings.compile_cache_mb * 1024 * 1024)  # shared by the slots
        self._tasks: list[asyncio.Task[None]] = []
        self._supervisors: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.metrics.slots.set(len(self.pool.slots))
        self.metrics.watch(self.metrics.slots_busy, lambda: self.busy)
        self.metrics.watch(self.metrics.stragglers, lambda: self.cores.stragglers)
        self._tasks = [
            asyncio.create_task(self._consume(slot), name=f"slot-{slot.index}")
            for slot in self.pool.slots
        ]
        self._supervisors = [
            asyncio.create_task(self._supervise(slot), name=f"supervise-{slot.index}")
            for slot in self.pool.zygotes
        ]

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.pool.zygotes)

    async def _supervise(self, slot: Slot) -> None:
        """Keep ``slot`` healthy: restart its zygote when it dies or fails its canary, backing
        off while that keeps failing, and rerun the canary every ``canary_interval_s``."""
        interval = self.settings.canary_interval_s or None
        while True:
            if not slot.healthy:
                await self._recover(slot)
            try:
                await asyncio.wait_for(slot.wait_exit(), interval)
            except asyncio.TimeoutError:
                if await slot.prove() is not None:
                    self.metrics.slot_start_failures.labels("canary").inc()
                    log.error("%s; restarting it", slot.last_error)

    async def _recover(self, slot: Slot) -> None:
        """Restart ``slot`` until it passes its canary. Consecutive failures wait
        ``restart_backoff(failures)``; a failure is logged when its reason changes, not at
        every attempt, so a slot that fails the same way for hours writes one line."""
        logged = None
        while not slot.healthy:
            delay = restart_backoff(slot.failures)
            if delay:
                await asyncio.sleep(delay)
            try:
                await slot.recover()
            except SlotStartError as exc:
                kind = "canary" if isinstance(exc, CanaryFailed) else "start"
                self.metrics.slot_start_failures.labels(kind).inc()
                if slot.last_error != logged:
                    logged = slot.last_error
                    log.error("%s; retrying with backoff (up to %.0f s)", exc, MAX_BACKOFF_S)
                continue
            self.metrics.slot_restarts.inc()
            if logged:
                log.warning("slot %d: recovered (zygote pid %s)", slot.index, slot.pid)
            else:
                log.warning("slot %d: zygote restarted (pid %s)", slot.index, slot.pid)

    async def _take(self) -> Job | None:
        """The next job, once a core is free for it (``cores``); None once the source is shut."""
        await self.cores.take()
        try:
            job = await self.source.get()
        except BaseException:
            self.cores.give()
            raise
        if job is None:
            self.cores.give()
        return job

    async def _consume(self, slot: Slot) -> None:
        """Slot ``slot``'s loop: one job at a time, on its full zygote or on its light one
        (``SlotPool.zygote_for``), holding a core until it ends or straggles (``cores``)."""
        while True:
            await slot.wait_healthy()  # a slot that cannot execute takes no work
            job = await self._take()
            if job is None:
                return
            taken = time.monotonic()
            try:
                with self.cores.held():
                    reserved = await self.memory.reserve(job.request.memory_mb)
                    try:
                        on = self.pool.zygote_for(
                            slot.index, job.request.code, job.request.language
                        )
                        await on.wait_healthy()  # it may have died while we waited for work
                        result = await self.run(on, job)
                    finally:
                        await self.memory.release(reserved)
            except asyncio.CancelledError:
                stopped = "the worker stopped before this execution finished"
                await self.source.done(job, result_for(job, Status.killed, stopped, self.name))
                raise
            if result is None:
                await self.source.retry(job)
                continue
            if result.message != DROPPED:
                self.executions += 1
                self.metrics.observe(result, job.tenant)
            await self.source.done(job, result)
            took = time.monotonic() - taken
            self.metrics.tenant_slot_seconds.labels(self.metrics.label(job.tenant)).inc(took)

    async def run(self, slot: Slot, job: Job) -> ExecuteResult | None:
        """Run one job on ``slot``; None means: give it to another slot (its zygote died)."""
        started = time.time()
        if started > job.start_by:
            return queue_timeout(job, self.settings.max_queue_wait_s, self.name)
        if job.abandoned.is_set():
            self.metrics.drop("queued")
            return result_for(job, Status.rejected, DROPPED, self.name)
        try:
            ran = await self._execute(slot, job)
        except SlotCrashed as exc:
            log.warning("%s (attempt %d of %d)", exc, job.attempts + 1, MAX_ATTEMPTS)
            if job.attempts + 1 < MAX_ATTEMPTS:
                return None
            why = f"{exc}; gave up after {MAX_ATTEMPTS} attempts"
            ran = Outcome(status=RunStatus.internal_error, message=why), None
        if ran is None:
            self.metrics.drop("running")
            return result_for(job, Status.killed, DROPPED, f"{self.name}/{slot.index}")
        outcome, compiled = ran
        return ExecuteResult(
            id=job.request.id,
            status=Status(outcome.status.value),
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            stdout_truncated=outcome.stdout_truncated,
            stderr_truncated=outcome.stderr_truncated,
            wall_time_s=outcome.wall_time_s,
            cpu_time_s=outcome.cpu_time_s,
            peak_memory_mb=outcome.peak_memory_mb,
            queue_time_s=round(started - job.enqueued_at, 6),
            worker=f"{self.name}/{slot.index}",
            message=outcome.message,
            compile=compile_result(compiled),
        )

    async def _execute(self, slot: Slot, job: Job) -> tuple[Outcome[str], Compiled | None] | None:
        """The job's outcome (and its build, if compiled), or None if it was abandoned while
        running: then its execution (or compile) is killed (``Slot.interrupt``), or, where that
        cannot be done, its zygote (which its supervisor restarts)."""
        execution = asyncio.ensure_future(self.compiler.execute(slot, zygote_request(job)))
        gone = asyncio.ensure_future(job.abandoned.wait())
        try:
            await asyncio.wait((execution, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            execution.cancel()
            raise
        finally:
            gone.cancel()
        if execution.done():
            return execution.result()
        if slot.interrupt():
            with contextlib.suppress(SlotCrashed, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(execution), INTERRUPT_WAIT_S)
        if not execution.done():
            await slot.kill()
        with contextlib.suppress(SlotCrashed, asyncio.CancelledError):
            await execution
        return None

    async def stop(self, grace_s: float) -> None:
        """Let running jobs finish for up to ``grace_s`` (the source must already be closed,
        so no new job is taken); then cancel, which answers the rest ``killed``."""
        for task in self._supervisors:
            task.cancel()
        self._supervisors = []
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
