"""Core tokens: at most ``cores`` executions start at full speed; a straggler gives its core back.

In one event loop with the slot loop's fake source and slots (no process starts), and the
kernel's own run-queue accounting for the wall-clock extension of a program starved of CPU.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import cast

import pytest

from sandbox_service import settings as settings_module
from sandbox_service.cores import Cores, MemoryBudget
from sandbox_service.executor import monitor
from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.protocol import Outcome
from sandbox_service.executor.zygote import _runqueue_wait_s
from sandbox_service.metrics import Metrics
from sandbox_service.settings import (
    MIN_MEMORY_BUDGET_MB,
    SERVICE_MB,
    ZYGOTE_MB,
    Settings,
    _cpu_quota,
    usable_cpus,
    usable_memory_mb,
)
from sandbox_service.slot_loop import SlotLoop
from tests.sandbox_service.test_slot_loop import FakePool, FakeSlot, FakeSource, _echo, _job, _run


def test_a_token_is_given_back_when_the_execution_ends_or_once_it_straggles() -> None:
    async def main() -> None:
        cores = Cores(1, after_s=0.05)
        await cores.take()
        with cores.held():
            assert (cores.taken, cores.stragglers) == (1, 0)
        assert cores.taken == 0  # ended before after_s
        await cores.take()
        with cores.held():
            await asyncio.sleep(0.1)
            assert (cores.taken, cores.stragglers) == (0, 1)  # straggling: its core is free
            await asyncio.wait_for(cores.take(), 1)  # ... for the next job
            cores.give()
        assert (cores.taken, cores.stragglers) == (0, 0)

    _run(main)


def test_with_zero_after_s_a_token_is_held_to_the_end() -> None:
    async def main() -> None:
        cores = Cores(1, after_s=0)
        await cores.take()
        with cores.held():
            await asyncio.sleep(0.05)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(cores.take(), 0.05)
        assert cores.taken == 0

    _run(main)


def test_a_freed_token_goes_to_the_slot_that_waited_least() -> None:
    """A stack, not a queue: the last slot to begin waiting finished last (its zygote is warm)."""

    async def main() -> None:
        cores = Cores(1, after_s=0)
        await cores.take()
        order: list[str] = []

        async def wait(name: str) -> None:
            await cores.take()
            order.append(name)
            cores.give()

        first = asyncio.create_task(wait("first"))
        await asyncio.sleep(0)
        last = asyncio.create_task(wait("last"))
        await asyncio.sleep(0)
        cores.give()
        await asyncio.gather(first, last)
        assert order == ["last", "first"]
        assert (cores.taken, cores._free) == (0, 1)

    _run(main)


def test_a_waiter_cancelled_after_its_token_came_passes_it_on() -> None:
    async def main() -> None:
        cores = Cores(1, after_s=0)
        await cores.take()
        other = asyncio.create_task(cores.take())
        cancelled = asyncio.create_task(cores.take())
        await asyncio.sleep(0)
        cores.give()  # handed to ``cancelled``, the last to wait ...
        cancelled.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.wait_for(other, 1)  # the token was not lost
        assert cores.taken == 1
        cores.give()
        assert cores._free == 1

    _run(main)


def _loop(slots: list[FakeSlot], source: FakeSource, cores: int, after_s: float) -> SlotLoop:
    config = Settings(max_queue_wait_s=30, canary_interval_s=0, cores=cores,
                      straggler_after_s=after_s)  # fmt: skip
    return SlotLoop(cast(SlotPool, FakePool(slots)), source, config, Metrics(), "node")


def test_hung_programs_hold_slots_not_cores() -> None:
    """One core, four slots: three hung programs straggle, and the short ones behind them run
    on the one core meanwhile instead of waiting for the hung ones' timeouts."""

    async def main() -> None:
        running: list[str] = []
        most = [0]
        short_done: dict[str, float] = {}
        began = time.monotonic()

        async def behave(code: str) -> Outcome[str]:
            running.append(code)
            most[0] = max(most[0], sum(1 for c in running if c.startswith("short")))
            try:
                await asyncio.sleep(1.0 if code.startswith("hung") else 0.01)
            finally:
                running.remove(code)
            if code.startswith("short"):
                short_done[code] = time.monotonic() - began
            return await _echo(code)

        jobs = [_job(f"hung{i}") for i in range(3)] + [_job(f"short{i}") for i in range(20)]
        source = FakeSource(jobs)
        loop = _loop([FakeSlot(i, behave) for i in range(4)], source, cores=1, after_s=0.05)  # fmt: skip
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert len(source.answers) == 23
        assert max(short_done.values()) < 0.9  # all before the first hung program ended
        assert most[0] == 1  # short programs never ran two at a time on one core

    _run(main)


def test_with_slots_equal_to_cores_hung_programs_block_as_before() -> None:
    async def main() -> None:
        order: list[str] = []

        async def behave(code: str) -> Outcome[str]:
            await asyncio.sleep(0.3 if code == "hung" else 0.0)
            order.append(code)
            return await _echo(code)

        source = FakeSource([_job("hung"), _job("short")])
        loop = _loop([FakeSlot(0, behave)], source, cores=1, after_s=0.05)
        loop.start()
        source.close()
        await loop.stop(grace_s=5)
        assert order == ["hung", "short"]  # one slot: the straggler's core has no other slot

    _run(main)


def _spin_on_cpu0() -> int:
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {0})
        while True:
            pass
    return pid


def test_the_kernel_reports_the_time_a_starved_process_waited_for_a_cpu() -> None:
    """Two spinners on one CPU: each waits about half the time, and schedstat says so."""
    if not os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        pytest.skip("this kernel has no /proc/PID/schedstat")
    pids = [_spin_on_cpu0(), _spin_on_cpu0()]
    try:
        time.sleep(0.6)
        waited = [_runqueue_wait_s(pid) for pid in pids]
    finally:
        for pid in pids:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert all(w > 0.1 for w in waited), waited
    assert _runqueue_wait_s(pids[0]) == 0.0  # gone: nothing to say


def test_time_spent_waiting_for_a_cpu_extends_the_wall_clock_limit_up_to_its_cap() -> None:
    def watched(sleep_s: float, timeout_s: float, waited_s: float) -> monitor.Watch:
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:
            time.sleep(sleep_s)
            os._exit(0)
        child = monitor.ChildExit(pid)
        try:
            seen = monitor.watch(
                child, {}, timeout_s, began, waited=lambda: waited_s, max_extension_s=timeout_s
            )
            seen.end -= began  # seconds after the start
            return seen
        finally:
            child.close()
            os.kill(pid, 9)
            os.waitpid(pid, 0)

    helped = watched(sleep_s=0.4, timeout_s=0.3, waited_s=0.25)
    assert helped.exited and helped.reason is None and helped.extended_s == 0.25
    capped = watched(sleep_s=2.0, timeout_s=0.2, waited_s=5.0)
    assert capped.reason == "timeout"
    assert capped.extended_s == 0.2  # at most max_extension_s
    assert capped.end >= 0.4
    plain = watched(sleep_s=2.0, timeout_s=0.2, waited_s=0.0)
    assert plain.reason == "timeout" and plain.extended_s == 0.0


def test_a_cgroup_cpu_quota_lowers_the_default_cores(tmp_path: Path) -> None:
    assert _cpu_quota(str(tmp_path)) is None  # no controller files: no quota
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cpu_quota(str(tmp_path)) is None
    (tmp_path / "cpu.max").write_text("250000 100000\n")  # a Kubernetes limit of 2.5 CPUs
    assert _cpu_quota(str(tmp_path)) == 2.5
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cpu_quota(str(tmp_path)) == 4.0
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_the_memory_budget_holds_a_job_until_enough_is_free() -> None:
    async def main() -> None:
        budget = MemoryBudget(100)
        first = await budget.reserve(60)
        waiting = asyncio.ensure_future(budget.reserve(60))
        await asyncio.sleep(0.05)
        assert not waiting.done() and budget.reserved_mb == 60
        await budget.release(first)
        assert await asyncio.wait_for(waiting, 1) == 60

    _run(main)


def test_a_request_larger_than_the_budget_waits_for_all_of_it_and_no_budget_never_waits() -> None:
    async def main() -> None:
        budget = MemoryBudget(100)
        assert await budget.reserve(500) == 100  # the whole budget, not a deadlock
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(budget.reserve(1), 0.05)
        await budget.release(100)
        assert budget.reserved_mb == 0
        assert await MemoryBudget(0).reserve(10_000) == 0

    _run(main)


def test_the_usable_memory_is_the_cgroups_limit_where_one_is_set(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8388608 kB\nMemFree:        1024 kB\n")  # 8 GiB
    root = tmp_path / "cgroup"
    root.mkdir()
    assert usable_memory_mb(str(root), str(meminfo)) == 8192  # no controller files
    (root / "memory.max").write_text("max\n")
    assert usable_memory_mb(str(root), str(meminfo)) == 8192
    (root / "memory.max").write_text(f"{4 << 30}\n")  # a Kubernetes limit of 4 GiB
    assert usable_memory_mb(str(root), str(meminfo)) == 4096
    (root / "memory.max").unlink()
    (root / "memory").mkdir()
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1: none
    assert usable_memory_mb(str(root), str(meminfo)) == 8192


def test_an_unset_memory_budget_keeps_the_zygotes_share_back(monkeypatch: pytest.MonkeyPatch,
                                                              ) -> None:  # fmt: skip
    monkeypatch.setattr(settings_module, "usable_memory_mb", lambda: 4096)
    assert Settings(slots=16).memory_budget() == 4096 - 16 * ZYGOTE_MB - SERVICE_MB
    assert Settings(slots=64).memory_budget() == MIN_MEMORY_BUDGET_MB  # never nothing
    assert Settings(slots=16, memory_budget_mb=0).memory_budget() == 0  # 0: no bound
    assert Settings(slots=16, memory_budget_mb=1000).memory_budget() == 1000
