"""The executor benchmark's modes: one function each, one ``Measurement`` out of each.

Every mode runs a few untimed executions first, then ``meter.begin()``, the measured
executions, ``meter.end(n)``: the CPU of each role is read around the measured part only.

- ``floor`` / ``floor-light``: ``loadtests.floor`` processes, with the preloads / with none;
- ``bare``: the slots driven directly from this process, no HTTP and no queue;
- target modes (``service``, ``redis``, ``service-cj``, ``codejudge``, and single requests for
  latency): the load generator's closed loop (``generator.drive``) with a target of
  ``loadtests.targets``, so every HTTP figure comes from one client;
- ``naive``: the generator with ``NaiveTarget``, a fresh interpreter per call.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from loadtests.cpu import Meter, PerExecution
from loadtests.floor import WARM, Floor
from loadtests.generator import Plan, Recorder, drive
from loadtests.targets import Target
from loadtests.workloads import Item
from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.protocol import Limits, RunSpec


@dataclass
class Measurement:
    """One mode on one workload in one round."""

    mode: str
    workload: str
    n: int
    seconds: float
    latencies: list[float]
    wrong: int
    cpu: PerExecution
    queue_waits: list[float] = field(default_factory=list)
    extra: float | None = None  # Redis round trips per execution
    example: str = ""  # the output of a wrong answer, to show


async def floor_mode(
    floor: Floor, mode: str, workload: str, code: str, expected: str, n: int, meter: Meter,
    active: int | None = None, warm: int = WARM,
) -> Measurement:  # fmt: skip
    """``active`` processes of the floor (default: all) share ``n`` executions, after
    ``warm`` each."""
    await asyncio.to_thread(floor.prepare, code, expected, active, warm)
    meter.begin()
    run = await asyncio.to_thread(floor.go, n)
    cpu, _ = meter.end(n)
    return Measurement(mode, workload, n, run.seconds, run.latencies, run.wrong, cpu,
                       example=run.example)  # fmt: skip


async def bare_mode(
    pool: SlotPool, workload: str, code: str, expected: str, n: int, meter: Meter
) -> Measurement:
    """Each slot runs requests back to back, pulling from one iterator."""
    request = RunSpec(code=code, limits=Limits(timeout_s=30, memory_mb=1024))
    latencies: list[float] = []
    wrong: list[Any] = [0, ""]

    async def slot_loop(index, todo) -> None:  # type: ignore[no-untyped-def]
        slot = pool.zygote_for(index, code)  # as the service's worker chooses
        for _ in todo:
            t = time.monotonic()
            out = await slot.execute(request)
            latencies.append(time.monotonic() - t)
            if out.stdout != expected:
                wrong[0] = int(wrong[0]) + 1
                wrong[1] = wrong[1] or f"{out.status.value}: {out.stdout[-200:]}"

    warm = iter(range(2 * len(pool.slots)))
    await asyncio.gather(*(slot_loop(i, warm) for i in range(len(pool.slots))))
    latencies.clear()
    meter.begin()
    todo = iter(range(n))
    start = time.monotonic()
    await asyncio.gather(*(slot_loop(i, todo) for i in range(len(pool.slots))))
    seconds = time.monotonic() - start
    cpu, _ = meter.end(n)
    return Measurement("bare", workload, n, seconds, latencies, int(wrong[0]), cpu,
                       example=str(wrong[1]))  # fmt: skip


async def target_mode(
    target: Target, mode: str, workload: str, item: Item, n: int, plan: Plan, meter: Meter,
    warm: int | None = None,
) -> Measurement:  # fmt: skip
    """``n`` copies of ``item`` through ``target`` in the shape of ``plan`` (its count is
    ignored), after ``warm`` untimed ones (default: as many as ``plan`` has in flight)."""
    warm = min(n, plan.in_flight) if warm is None else warm
    await drive(target, itertools.repeat(item, warm), _count(plan, warm), Recorder())
    meter.begin()
    recorder = Recorder()
    await drive(target, itertools.repeat(item, n), _count(plan, n), recorder)
    cpu, extra = meter.end(n)
    r = recorder
    seconds = (r.last_answer or 0.0) - (r.first_sent or 0.0)
    example = next((str(e["status"]) + ": " + e["stdout"] for e in r.wrong_examples), "")
    if r.lost:
        example = f"{r.lost} lost: {dict(r.lost_reasons)} " + example
    return Measurement(mode, workload, r.answered, seconds, r.latency, r.wrong + r.lost, cpu,
                       r.queue_wait, extra, example)  # fmt: skip


def _count(plan: Plan, n: int) -> Plan:
    return Plan(n, plan.concurrency, plan.batch, plan.duration_s, plan.drain_s)
