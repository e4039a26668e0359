"""Zygotes are replaced when they die, and the execution they held is not lost."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import start


def _wait_for_restart(client: SandboxClient, index: int, old_pid: int, light: bool = False) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report = client.status()
        slot = (report.light_slots if light else report.slots)[index]
        if slot.pid not in (None, old_pid):
            return
        time.sleep(0.1)
    raise AssertionError("zygote was not restarted")


def test_killed_zygote_is_replaced(client: SandboxClient) -> None:
    before = client.status().slots
    pid = before[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_for_restart(client, 0, pid)
    after = client.status().slots
    assert after[0].restarts == before[0].restarts + 1
    results = client.execute_batch(["print('next')"] * 4)
    assert all(r.stdout == "next\n" for r in results)


@pytest.mark.parametrize("light", [False, True], ids=["full", "light"])
def test_execution_on_a_dying_zygote_is_retried(client: SandboxClient, light: bool) -> None:
    """Whichever zygote of the slot runs it (numpy sends it to the full one)."""
    code = ("" if light else "import numpy\n") + "import time; time.sleep(1.0); print('survived')"
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(client.execute_batch([code] * 2)))
    runner.start()
    time.sleep(0.4)  # both slots are in the middle of their execution
    report = client.status()
    group = report.light_slots if light else report.slots
    assert [s.busy for s in group] == [True, True]
    victim = group[1].pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    runner.join(60)
    assert [r.status for r in results] == [Status.ok, Status.ok]
    assert all(r.stdout == "survived\n" for r in results)
    _wait_for_restart(client, 1, victim, light)


def test_zygote_killed_mid_run_without_mount_namespace_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """Without the mount layer each run has a directory under work_root: the one a killed
    zygote held must neither break its successor nor stay behind."""
    # Slot uids must reach their run directories: not under pytest's root-only tmp_path.
    work_root = Path(tempfile.mkdtemp(prefix="sbx-slot-test-"))
    work_root.chmod(0o711)
    svc = start(str(tmp_path / "service.log"), slots=1, preload="math", warmup="",
                work_root=str(work_root), disable_isolation="mount")  # fmt: skip
    try:
        with SandboxClient(svc.url) as client:
            victim = client.status().slots[0].pid
            assert victim is not None
            slow = threading.Thread(
                target=lambda: client.execute("import time; time.sleep(30)", timeout_s=3)
            )
            slow.start()
            time.sleep(1.0)
            [slot_dir] = work_root.iterdir()
            assert list(slot_dir.iterdir()), "the run directory should exist"
            os.kill(victim, signal.SIGKILL)
            slow.join(60)
            results = client.execute_batch(["print('next')"] * 3)
            assert [r.stdout for r in results] == ["next\n"] * 3, results[0].message
            assert list(work_root.iterdir()) == [slot_dir]
            assert list(slot_dir.iterdir()) == []
    finally:
        svc.stop()
        shutil.rmtree(work_root, ignore_errors=True)
