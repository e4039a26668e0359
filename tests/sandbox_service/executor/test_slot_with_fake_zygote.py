"""The slot's own logic, in process: a fake launcher answers frames as a zygote would.

No zygote process starts here (milliseconds per test): the fake speaks the protocol over a
socketpair and answers each run with what the test scripted. What a real zygote does is
tested in test_execution.py and test_slot.py.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable
from typing import Any

import pytest

from sandbox_service.executor import memory, protocol, slot
from sandbox_service.executor.pool import zygote_config
from sandbox_service.executor.protocol import (
    IsolationReport,
    Limits,
    Outcome,
    RunSpec,
    RunStatus,
    StartReport,
    ZygoteConfig,
)
from sandbox_service.executor.slot import CANARY, CanaryFailed, Slot, SlotCrashed, SlotStartError
from sandbox_service.settings import Settings

HANG = object()  # an answer: never reply
DIE = object()  # an answer: the zygote process dies
Answer = Callable[[RunSpec[Any]], "Outcome[str] | object"]


def canary_or(answer: Answer) -> Answer:
    """The right answer to the canary, ``answer`` to everything else."""

    def reply(spec: RunSpec[Any]) -> Outcome[str] | object:
        if spec.code == CANARY.code:
            return Outcome(status=RunStatus.ok, stdout=CANARY.expected)
        return answer(spec)

    return reply


def echo(spec: RunSpec[Any]) -> Outcome[str]:
    return Outcome(status=RunStatus.ok, stdout=str(spec.code), exit_code=0)


class FakeProcess:
    """What a slot sees of a started zygote."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []
        self._exited = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            if self.writer is not None:
                self.writer.close()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.exit(-sig)


class FakeZygote:
    """A launcher whose zygotes answer in this process: first a ready report, then
    ``answer(spec)`` to each run (by default the canary's right answer, else the code echoed)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer or canary_or(echo)
        self.received: list[RunSpec[Any]] = []
        self.exits = 0  # "exit" frames received
        self.processes: list[FakeProcess] = []
        self.tasks: list[asyncio.Task[None]] = []

    def report(self, pid: int) -> StartReport:
        isolation = IsolationReport({"net": True, "uid": False}, {"uid": "not root"})
        return StartReport(pid=pid, isolation=isolation, rss_mb=12.5, cgroup=None)

    async def __call__(
        self, config: ZygoteConfig
    ) -> tuple[FakeProcess, asyncio.StreamReader, asyncio.StreamWriter]:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        zygote_reader, zygote_writer = await asyncio.open_unix_connection(sock=theirs)
        proc = FakeProcess(1000 + len(self.processes))
        proc.writer = zygote_writer
        self.processes.append(proc)
        self.tasks.append(asyncio.create_task(self._serve(proc, zygote_reader, zygote_writer)))
        return proc, reader, writer

    async def _serve(self, proc: FakeProcess, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(protocol.encode(self.report(proc.pid).frame()))
        while proc.returncode is None:
            try:
                message = await protocol.read_message(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return proc.exit(0)
            if message["op"] == "exit":
                self.exits += 1
                return proc.exit(0)
            spec = RunSpec.from_frame(message)
            self.received.append(spec)
            answer = self.answer(spec)
            if answer is HANG:
                await asyncio.Event().wait()
            if answer is DIE:
                return proc.exit(-signal.SIGKILL)
            assert isinstance(answer, Outcome)
            writer.write(protocol.encode(answer.frame()))
            if answer.recycle:
                return proc.exit(0)


def config() -> ZygoteConfig:
    return zygote_config(Settings(slots=1), 0)


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 30))


def started(fake: FakeZygote) -> Callable[[Callable[[Slot], Any]], Any]:
    """Run ``body(slot)`` on a slot started and proven on ``fake``, stopped after."""

    def decorate(body: Callable[[Slot], Any]) -> Any:
        async def scenario() -> Any:
            s = Slot(config(), fake)
            await s.start()
            assert await s.prove() is None
            try:
                return await body(s)
            finally:
                await s.stop(grace_s=1)

        return run(scenario)

    return decorate


SPEC = RunSpec(
    code="print(1)", stdin="in", files={"a.txt": "eA=="}, limits=Limits(timeout_s=5, memory_mb=64)
)


def test_start_reads_the_typed_report() -> None:
    async def scenario() -> None:
        s = Slot(config(), FakeZygote())
        report = await s.start()
        assert s.report is report and report.pid == s.pid == 1000
        assert report.isolation.active("net") and report.isolation.note("uid") == "not root"
        assert s.alive and not s.healthy  # running, but the canary has not passed yet
        await s.kill()

    run(scenario)


def test_a_passed_canary_makes_the_slot_healthy() -> None:
    fake = FakeZygote()

    @started(fake)
    async def _(s: Slot) -> None:
        assert s.healthy and s.canaries == 1 and s.failures == 0
        assert fake.received[0].code == CANARY.code and fake.received[0].stdin == CANARY.stdin


def test_a_failed_canary_kills_the_zygote_and_says_why() -> None:
    fake = FakeZygote(lambda spec: Outcome(status=RunStatus.error, stderr="Traceback: boom"))

    async def scenario() -> None:
        s = Slot(config(), fake)
        await s.start()
        why = await s.prove()
        assert why is not None and "error" in why and "boom" in why
        assert not s.healthy and not s.alive and s.failures == 1 and s.last_error
        assert fake.processes[0].signals == [signal.SIGKILL]

    run(scenario)


def test_execute_sends_the_spec_and_returns_the_outcome() -> None:
    fake = FakeZygote()

    @started(fake)
    async def _(s: Slot) -> None:
        outcome = await s.execute(SPEC)
        assert (outcome.status, outcome.stdout, outcome.exit_code) == (RunStatus.ok, "print(1)", 0)
        assert fake.received[-1] == SPEC  # every field crossed the frame unchanged
        assert s.executions == 1 and not s.busy and s.healthy


def test_an_internal_error_with_recycle_is_a_crash_to_retry() -> None:
    fake = FakeZygote(canary_or(lambda spec: Outcome(
        status=RunStatus.internal_error, message="zygote: OSError", recycle=True)))  # fmt: skip

    @started(fake)
    async def _(s: Slot) -> None:
        with pytest.raises(SlotCrashed, match="zygote: OSError"):
            await s.execute(SPEC)
        assert not s.alive and not s.healthy


def test_a_recycled_zygote_still_answers_its_last_run() -> None:
    fake = FakeZygote(canary_or(lambda spec: Outcome(status=RunStatus.ok, recycle=True)))

    @started(fake)
    async def _(s: Slot) -> None:
        outcome = await s.execute(SPEC)
        assert outcome.status is RunStatus.ok and outcome.recycle
        assert not s.alive  # never reused: the next run waits for a restart


def test_a_zygote_that_dies_mid_run_is_a_crash() -> None:
    fake = FakeZygote(canary_or(lambda spec: DIE))

    @started(fake)
    async def _(s: Slot) -> None:
        with pytest.raises(SlotCrashed, match="lost during execution"):
            await s.execute(SPEC)
        assert not s.alive and not s.busy


def test_a_zygote_that_stops_answering_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slot, "WATCHDOG_GRACE_S", 0.05)
    fake = FakeZygote(canary_or(lambda spec: HANG))

    @started(fake)
    async def _(s: Slot) -> None:
        with pytest.raises(SlotCrashed):
            await s.execute(RunSpec(code="x", limits=Limits(timeout_s=0.05, memory_mb=64)))
        assert fake.processes[0].signals == [signal.SIGKILL] and not s.alive


def test_a_slot_that_is_not_running_refuses_work() -> None:
    async def scenario() -> None:
        s = Slot(config(), FakeZygote())
        with pytest.raises(SlotCrashed, match="not running"):
            await s.execute(SPEC)

    run(scenario)


@pytest.mark.parametrize(
    "first", [{"op": "run", "code": "x"}, None], ids=["not a ready frame", "closed at once"]
)
def test_a_zygote_that_does_not_start_is_a_start_error(first: dict[str, Any] | None) -> None:
    class Silent(FakeZygote):
        async def _serve(self, proc: FakeProcess, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:  # fmt: skip
            if first is not None:
                writer.write(protocol.encode(first))
                await asyncio.Event().wait()
            proc.exit(1)

    async def scenario() -> None:
        s = Slot(config(), Silent())
        with pytest.raises(SlotStartError):
            await s.start()
        assert not s.alive

    run(scenario)


def test_recover_restarts_and_counts() -> None:
    fake = FakeZygote()

    @started(fake)
    async def _(s: Slot) -> None:
        await s.recover()
        assert s.restarts == 1 and s.healthy and s.pid == 1001
        fake.answer = lambda spec: Outcome(status=RunStatus.ok, stdout="wrong\n")
        with pytest.raises(CanaryFailed):
            await s.recover()
        assert s.restarts == 2 and s.failures == 1 and not s.healthy


def test_stop_asks_the_zygote_to_exit() -> None:
    fake = FakeZygote()

    async def scenario() -> None:
        s = Slot(config(), fake)
        await s.start()
        await s.stop(grace_s=1)
        assert fake.exits == 1 and fake.processes[0].returncode == 0
        assert fake.processes[0].signals == []  # it went by itself

    run(scenario)


def test_the_zygotes_cgroup_is_removed_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    removed: list[str] = []

    def remove(path: str) -> bool:
        removed.append(path)
        return True

    monkeypatch.setattr(memory, "remove_cgroup", remove)
    fake = FakeZygote()
    fake.report = lambda pid: StartReport(  # type: ignore[method-assign]
        pid=pid, isolation=IsolationReport({"memory": True}), cgroup="/sys/fs/cgroup/x"
    )

    async def scenario() -> None:
        s = Slot(config(), fake)
        await s.start()
        await s.kill()
        assert removed == ["/sys/fs/cgroup/x"]

    run(scenario)
