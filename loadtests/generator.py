"""The load generator: a closed loop of lanes driving a target, and a record of every answer.

``concurrency`` executions are in flight at once: ``concurrency // batch`` lanes, each sending
one batch, waiting for its answer, and sending the next, until ``count`` items are sent or
``duration_s`` has passed (counted from when the target's clients are open). Answers still out
then get ``drain_s`` more; whatever has no answer after that is counted lost, as is every batch
the target could not get an answer for. Nothing runs unbounded: the whole run ends by
``duration_s + drain_s`` after the clients open at the latest.

Each answer is checked against its item's expectation; ``Recorder`` keeps the end-to-end
latency, how much of it passed before the request was on the wire (waiting for or opening a
connection, 429 retries), the service's queue wait and run time, the status, when the answer
arrived, and an estimate of when the execution itself finished (sent + queue wait + run
time: in a batch of a thousand, long before the batch's answer; too early by however long
the request took to reach the queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from loadtests.procwatch import Watcher
from loadtests.targets import NoAnswer, Target
from loadtests.workloads import Item

WRONG_EXAMPLES = 20
UNANSWERED_AT_STOP = "no answer when the run stopped"
SERVICE_FAILURES = frozenset({"internal_error", "queue_timeout"})


@dataclass(frozen=True)
class Plan:
    count: int
    concurrency: int = 64
    batch: int = 1
    duration_s: float = 600.0
    drain_s: float = 300.0

    def __post_init__(self) -> None:
        if self.count < 0 or self.concurrency < 1 or self.batch < 1:
            raise ValueError("count must be >= 0, concurrency and batch >= 1")

    @property
    def lanes(self) -> int:
        return max(1, self.concurrency // self.batch)

    @property
    def in_flight(self) -> int:
        """Executions in flight at once: the lanes times the batch size."""
        return self.lanes * min(self.batch, self.concurrency)


@dataclass
class Recorder:
    """Every answer and loss of one run. Times are seconds; ``done_at`` is since the start."""

    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    outstanding: int = 0  # sent, not yet answered or lost: executions in flight now
    max_outstanding: int = 0
    lost: int = 0
    wrong: int = 0
    latency: list[float] = field(default_factory=list)
    send_wait: list[float] = field(default_factory=list)  # before the request was on the wire
    queue_wait: list[float] = field(default_factory=list)
    run_time: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    lost_reasons: Counter[str] = field(default_factory=Counter)
    wrong_kinds: Counter[str] = field(default_factory=Counter)
    wrong_examples: list[dict[str, Any]] = field(default_factory=list)
    # Why the service did not run a request to completion (internal_error, queue_timeout):
    # "status: message" -> count, digits masked so that one cause is one line.
    service_failures: Counter[str] = field(default_factory=Counter)
    first_sent: float | None = None
    last_answer: float | None = None

    @property
    def answered(self) -> int:
        return len(self.latency)

    def sending(self, items: list[Item], now: float) -> None:
        self.sent += len(items)
        self.outstanding += len(items)
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if self.first_sent is None:
            self.first_sent = now

    def answer(
        self, item: Item, result: dict[str, Any], latency: float, now: float, send_wait: float = 0.0
    ) -> None:
        queue_wait = float(result.get("queue_time_s") or 0.0)
        run_time = float(result.get("wall_time_s") or 0.0)
        self.outstanding -= 1
        self.latency.append(latency)
        self.send_wait.append(send_wait)
        self.queue_wait.append(queue_wait)
        self.run_time.append(run_time)
        self.done_at.append(now - self.started)
        self.finished_at.append(min(now - latency + queue_wait + run_time, now) - self.started)
        self.last_answer = now
        status = str(result.get("status"))
        self.statuses[status] += 1
        if status in SERVICE_FAILURES:
            message = re.sub(r"\d+(\.\d+)?", "N", str(result.get("message", "")))[:120]
            self.service_failures[f"{status}: {message}"] += 1
        if not item.check(result):
            self.wrong += 1
            self.wrong_kinds[item.kind] += 1
            if len(self.wrong_examples) < WRONG_EXAMPLES:
                self.wrong_examples.append(wrong_example(item, result))

    def lose(self, items: list[Item], reason: str) -> None:
        self.outstanding -= len(items)
        self.lost += len(items)
        self.lost_reasons[reason] += len(items)


def wrong_example(item: Item, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "code": item.request.get("code", "")[:300],
        "expected_statuses": sorted(item.statuses),
        "expected_stdout": item.stdout,
        "status": result.get("status"),
        "stdout": str(result.get("stdout", ""))[:300],
        "stderr": str(result.get("stderr", ""))[-300:],
        "message": str(result.get("message", ""))[:300],
    }


class Progress:
    """A status line on stderr: answers, rate over the last interval, lost, wrong, statuses.
    Rewritten in place on a terminal, a line every ``log_every_s`` otherwise."""

    def __init__(
        self,
        recorder: Recorder,
        total: int,
        label: str,
        stream: TextIO | None = None,
        watcher: Watcher | None = None,
    ) -> None:
        self.recorder = recorder
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.watcher = watcher
        self.tty = self.stream.isatty()
        self.log_every_s = 1.0 if self.tty else 10.0

    def line(self, rate: float) -> str:
        r = self.recorder
        elapsed = time.monotonic() - r.started
        width = len(str(self.total))
        not_ok = sum(n for s, n in r.statuses.items() if s != "ok")
        text = (
            f"[{self.label} {elapsed:6.1f}s] {r.answered:{width}d}/{self.total} answered "
            f"{rate:8.1f}/s  lost {r.lost}  wrong {r.wrong}  not-ok {not_ok}"
        )
        if self.watcher is not None and self.watcher.last_depth is not None:
            text += f"  server depth {self.watcher.last_depth}"
        return text

    async def run(self) -> None:
        last_n, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(self.log_every_s)
            now = time.monotonic()
            n = self.recorder.answered
            rate = (n - last_n) / max(now - last_t, 1e-9)
            last_n, last_t = n, now
            self.write(self.line(rate))

    def write(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        r = self.recorder
        span = (r.last_answer or time.monotonic()) - (r.first_sent or r.started)
        self.write(self.line(r.answered / max(span, 1e-9)))
        if self.tty:
            self.stream.write("\n")


async def drive(target: Target, items: Iterable[Item], plan: Plan, recorder: Recorder) -> None:
    """Send ``plan.count`` items (fewer if the duration runs out) and record every outcome."""
    source: Iterator[Item] = itertools.islice(iter(items), plan.count)
    size = min(plan.batch, plan.concurrency)
    await target.open(plan.lanes)
    # The duration counts from here, once the clients are open: on a stalled machine opening
    # them could use up a short duration before any lane had sent.
    stop_sending = time.monotonic() + plan.duration_s
    hard_stop = stop_sending + plan.drain_s

    async def lane(index: int) -> None:
        while time.monotonic() < stop_sending:
            batch = list(itertools.islice(source, size))
            if not batch:
                return
            sent_at = time.monotonic()
            recorder.sending(batch, sent_at)
            try:
                reply = await target.send(batch, index, hard_stop)
            except NoAnswer as exc:
                recorder.lose(batch, exc.reason)
                continue
            except asyncio.CancelledError:
                recorder.lose(batch, UNANSWERED_AT_STOP)
                raise
            now = time.monotonic()
            send_wait = 0.0 if reply.on_wire is None else reply.on_wire - sent_at
            for item, result in zip(batch, reply.results, strict=True):
                recorder.answer(item, result, now - sent_at, now, send_wait)

    try:
        tasks = [asyncio.create_task(lane(i), name=f"lane-{i}") for i in range(plan.lanes)]
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_stop - time.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # a bug in a lane is raised, not hidden
    finally:
        await target.close()


class ClientGC:
    """The client's garbage collector during a run, kept from stalling the client.

    With thousands of requests in flight, automatic full collections walked millions of live
    objects and stopped the client for up to 1.3 s at a time (9.5 s over a 5,000-connection
    run here), which showed as answers/s falling to zero while the service worked on. So
    automatic collection is off during a run; a task collects the young generations every
    ``period_s`` (cheap: they hold only recent objects), and the full collection waits for
    the end. Pauses are recorded either way."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.pauses: list[float] = []
        self._started = 0.0
        self._was_enabled = True

    def _callback(self, phase: str, _: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    async def collect_young(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            gc.collect(1)

    def __enter__(self) -> ClientGC:
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)
        if self._was_enabled:
            gc.enable()

    def summary(self) -> dict[str, float]:
        return {
            "collections": len(self.pauses),
            "total_s": round(sum(self.pauses), 3),
            "max_ms": round(max(self.pauses, default=0.0) * 1000, 1),
        }


@dataclass
class Run:
    """One measured run: what was asked, what was recorded, and what it cost in CPU."""

    label: str
    target: str
    workload: str
    plan: Plan
    recorder: Recorder
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    watcher: Watcher | None = None
    retries: dict[str, int] = field(default_factory=dict)
    client_gc: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def unsent(self) -> int:
        return self.plan.count - self.recorder.sent

    @property
    def seconds(self) -> float:
        r = self.recorder
        if r.first_sent is None or r.last_answer is None:
            return 0.0
        return r.last_answer - r.first_sent


def children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


async def measure(
    target: Target,
    items: Iterable[Item],
    plan: Plan,
    *,
    workload: str,
    target_name: str,
    watcher: Watcher | None = None,
    progress: bool = True,
) -> Run:
    """``drive`` with CPU accounting, server sampling and a progress line around it.

    Client CPU is this process's own; server CPU is the watched process tree's, or, for a
    target that spawns children of this process (the naive baseline), those children's.
    """
    recorder = Recorder()
    side: list[asyncio.Task[None]] = []
    show = Progress(recorder, plan.count, target.label, watcher=watcher) if progress else None
    if show is not None:
        side.append(asyncio.create_task(show.run()))
    if watcher is not None:
        await watcher.begin()
        side.append(asyncio.create_task(watcher.run()))
    target.retries.clear()
    cpu0, children0 = time.process_time(), children_cpu_s()
    with ClientGC() as collector:
        side.append(asyncio.create_task(collector.collect_young()))
        try:
            await drive(target, items, plan, recorder)
        finally:
            for task in side:
                task.cancel()
            for task in side:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    run = Run(target.label, target_name, workload, plan, recorder)
    run.client_cpu_s = time.process_time() - cpu0
    run.client_gc = collector.summary()
    gc.collect()
    run.retries = dict(target.retries)
    if watcher is not None:
        await watcher.end()
        run.watcher = watcher
        run.server_cpu_s = watcher.cpu_s()
    elif children_cpu_s() > children0:
        run.server_cpu_s = children_cpu_s() - children0
    if show is not None:
        show.finish()
    return run
