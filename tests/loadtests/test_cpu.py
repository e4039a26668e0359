"""CPU per execution by role, read from /proc around real processes."""

from __future__ import annotations

import os
import subprocess

from loadtests.cpu import ZYGOTE, Meter, Roles, children_of, fixed, per_execution, total_ms
from loadtests.procwatch import Proc
from sandbox_service.service_process import ServiceProcess
from tests.loadtests.forker import run_forker


def test_reaped_children_are_counted_as_the_executions(forker: subprocess.Popen[str]) -> None:
    meter = Meter(Roles({"zygote": fixed(forker.pid)}))
    meter.begin()
    run_forker(forker)
    cpu, extra = meter.end(4)
    user, system = cpu["children"]
    assert user >= 180 and user + system <= 260, cpu  # 0.2 s each, at tick resolution
    assert sum(cpu["zygote"]) < 20 and extra is None
    assert total_ms(cpu) == sum(cpu["zygote"]) + user + system


def _proc(pid: int, ticks: int) -> Proc:
    return Proc(pid, 1, "S", ticks, ticks, ticks, ticks, 1.0)


def test_a_process_that_appeared_counts_from_zero_one_that_vanished_not_at_all() -> None:
    roles = Roles({"zygote": fixed()})
    before = {"zygote": {10: _proc(10, 100), 11: _proc(11, 100)}}  # 11 then died
    after = {"zygote": {10: _proc(10, 150), 12: _proc(12, 30)}}  # 12 replaced it
    cpu = per_execution(roles, before, after, n=4)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert cpu["zygote"] == cpu["children"] == (80 / 4 * tick_ms, 80 / 4 * tick_ms)


def test_the_zygotes_of_a_service_are_found_from_its_pid(own_service: ServiceProcess) -> None:
    zygotes = children_of(fixed(own_service.process.pid), ZYGOTE)()
    assert len(zygotes) == 4  # a full and a light zygote per slot
    assert children_of(fixed(own_service.process.pid), "no-such-command")() == []
