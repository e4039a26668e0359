"""The slot loop in one event loop, with a fake job source and fake slots: no process starts.

Every job taken is answered: run, ``queue_timeout`` past its start deadline, retried once when
its zygote dies under it and ``internal_error`` after that, ``killed`` when the loop stops
first; a slot that cannot execute is restarted with backoff and takes no work meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.protocol import Outcome, RunSpec, RunStatus
from sandbox_service.executor.slot import SlotCrashed, SlotStartError
from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import MAX_ATTEMPTS, Job
from sandbox_service.settings import Settings
from sandbox_service.slot_loop import MAX_BACKOFF_S, SlotLoop, restart_backoff

SETTINGS = Settings(max_queue_wait_s=30, canary_interval_s=0)


class FakeSource:
    """Jobs from a list, answers kept; ``retry`` puts a job back first, as the real ones do."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = deque(jobs)
        self.closed = False
        self.answers: dict[str, ExecuteResult] = {}
        self.retried = 0

    def close(self) -> None:
        self.closed = True

    async def get(self) -> Job | None:
        while not self.jobs:
            if self.closed:
                return None
            await asyncio.sleep(0.001)
        return self.jobs.popleft()

    async def done(self, job: Job, result: ExecuteResult) -> None:
        assert job.request.id not in self.answers, "answered twice"
        self.answers[job.request.id or ""] = result

    async def retry(self, job: Job) -> None:
        self.retried += 1
        job.attempts += 1
        self.jobs.appendleft(job)


class FakeSlot:
    """A slot whose zygote runs ``behave(code)``: an outcome, or it raises SlotCrashed."""

    def __init__(self, index: int, behave: Callable[[str], Awaitable[Outcome[str]]]) -> None:
        self.index = index
        self.behave = behave
        self.pid = 1000 + index
        self.busy = False
        self.healthy = True
        self.failures = 0
        self.last_error: str | None = None
        self.recoveries = 0
        self.fail_recoveries = 0
        self._exited = asyncio.Event()

    async def execute(self, request: RunSpec[str]) -> Outcome[str]:
        self.busy = True
        try:
            return await self.behave(request.code)
        finally:
            self.busy = False

    async def wait_healthy(self) -> None:
        while not self.healthy:
            await asyncio.sleep(0.001)

    async def wait_exit(self) -> None:
        await self._exited.wait()

    async def prove(self) -> str | None:
        return None

    async def recover(self) -> None:
        self.recoveries += 1
        if self.fail_recoveries:
            self.fail_recoveries -= 1
            self.failures += 1
            self.last_error = f"slot {self.index}: zygote did not start"
            raise SlotStartError(self.last_error)
        self.healthy, self.failures, self.last_error = True, 0, None


class FakePool:
    def __init__(self, slots: list[FakeSlot]) -> None:
        self.slots = slots
        self.zygotes = slots

    def zygote_for(self, index: int, code: str, language: str = "python") -> FakeSlot:
        return self.slots[index]


async def _echo(code: str) -> Outcome[str]:
    return Outcome(status=RunStatus.ok, exit_code=0, stdout=code)


def _job(code: str, start_in_s: float = 30.0) -> Job:
    now = time.time()
    return Job(ExecuteRequest(code=code, id=code), enqueued_at=now, start_by=now + start_in_s)


def _loop(slots: list[FakeSlot], source: FakeSource) -> tuple[SlotLoop, Metrics]:
    metrics = Metrics()
    pool = cast(SlotPool, FakePool(slots))
    return SlotLoop(pool, source, SETTINGS, metrics, "node"), metrics


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 10))


def test_every_job_is_run_on_some_slot_and_answered_once() -> None:
    async def main() -> None:
        source = FakeSource([_job(str(i)) for i in range(20)])
        loop, metrics = _loop([FakeSlot(0, _echo), FakeSlot(1, _echo)], source)
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert sorted(source.answers) == sorted(str(i) for i in range(20))
        for code, result in source.answers.items():
            assert (result.status, result.stdout) == (Status.ok, code)
            assert result.worker in ("node/0", "node/1") and result.queue_time_s >= 0
        assert loop.executions == 20 and metrics.by_status == {"ok": 20}

    _run(main)


def test_a_job_past_its_start_deadline_is_answered_without_running() -> None:
    async def main() -> None:
        ran: list[str] = []

        async def record(code: str) -> Outcome[str]:
            ran.append(code)
            return await _echo(code)

        source = FakeSource([_job("late", start_in_s=-1), _job("fine")])
        loop, _ = _loop([FakeSlot(0, record)], source)
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert ran == ["fine"]
        assert source.answers["late"].status is Status.queue_timeout
        assert "not started within 30 s" in source.answers["late"].message

    _run(main)


def test_a_zygote_that_dies_once_is_retried_and_then_the_job_runs() -> None:
    async def main() -> None:
        deaths = [1]

        async def dies_once(code: str) -> Outcome[str]:
            if deaths.pop() if deaths else 0:
                raise SlotCrashed("slot 0: zygote died")
            return await _echo(code)

        source = FakeSource([_job("x")])
        loop, _ = _loop([FakeSlot(0, dies_once)], source)
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert source.retried == 1 and source.answers["x"].status is Status.ok

    _run(main)


def test_a_job_that_kills_every_zygote_ends_internal_error() -> None:
    async def main() -> None:
        async def always_dies(code: str) -> Outcome[str]:
            raise SlotCrashed("slot 0: zygote died")

        source = FakeSource([_job("poison")])
        slot = FakeSlot(0, always_dies)
        loop, _ = _loop([slot], source)
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert source.retried == MAX_ATTEMPTS - 1
        answer = source.answers["poison"]
        assert answer.status is Status.internal_error
        assert f"gave up after {MAX_ATTEMPTS} attempts" in answer.message

    _run(main)


def test_stopping_answers_the_running_job_killed() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def hangs(code: str) -> Outcome[str]:
            started.set()
            await asyncio.sleep(60)
            raise AssertionError("not reached")

        source = FakeSource([_job("slow")])
        loop, _ = _loop([FakeSlot(0, hangs)], source)
        loop.start()
        await started.wait()
        source.close()
        await loop.stop(grace_s=0.05)
        answer = source.answers["slow"]
        assert answer.status is Status.killed and "stopped before" in answer.message

    _run(main)


def test_an_unhealthy_slot_takes_no_work_until_it_is_recovered() -> None:
    async def main() -> None:
        sick = FakeSlot(0, _echo)
        sick.healthy, sick.failures, sick.fail_recoveries = False, 0, 1
        source = FakeSource([_job("x")])
        loop, metrics = _loop([sick], source)
        loop.start()
        while "x" not in source.answers:
            await asyncio.sleep(0.01)
        source.close()
        await loop.stop(grace_s=5)
        # One failed restart (then a 0.5 s backoff), one that worked; only then the job ran.
        assert sick.recoveries == 2 and source.answers["x"].status is Status.ok
        assert metrics.slot_restarts._value.get() == 1

    _run(main)


@pytest.mark.parametrize(
    ("failures", "delay"), [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (20, MAX_BACKOFF_S)]
)
def test_restart_backoff_doubles_up_to_its_cap(failures: int, delay: float) -> None:
    assert restart_backoff(failures) == delay
