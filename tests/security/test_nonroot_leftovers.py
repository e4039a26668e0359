"""The non-root shape (no pid namespace): an execution cut off with its zygote, and what it
double-forked, must not run on past the slot's recovery or the pool's shutdown.

The pool runs as an unprivileged uid of its own (``nonroot_pool.py``, through ``setpriv``), so
every process an execution starts has that uid: a scan of /proc for it finds any leftover.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_service.executor import isolation as iso

REPO = Path(__file__).resolve().parents[2]
SETTLE_S = 3.0  # for the last processes to be reaped after the pool's process exits


def _python_for_anyone() -> str | None:
    """A system Python of this interpreter's version (this one may live under root's home,
    closed to other users): it runs this package with this venv's packages on its path."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(version, path="/usr/bin:/usr/local/bin")
    return None if found is None or os.path.realpath(found).startswith("/root") else found


def _alive_of(uid: int) -> dict[int, str]:
    """``uid``'s processes and their command lines, zombies left out (they run nothing)."""
    alive = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            if iso.read_small(f"/proc/{entry}/stat").rsplit(b")", 1)[1].split()[0] != b"Z":
                alive[int(entry)] = (
                    iso.read_small(f"/proc/{entry}/cmdline")
                    .decode(errors="replace")
                    .replace("\0", " ")
                )
        except (OSError, IndexError):
            continue
    return alive


def _settled(uid: int) -> dict[int, str]:
    """What of ``uid`` is still alive once the processes being reaped are gone."""
    deadline = time.monotonic() + SETTLE_S
    while (alive := _alive_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _events(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield json.loads(line)


@pytest.fixture
def as_unprivileged() -> Iterator[tuple[int, list[str]]]:
    """A uid no one else uses, and the command that runs the pool as it (its working
    directories in a directory of its own under /tmp, which every uid can reach)."""
    python = _python_for_anyone()
    if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
        pytest.skip("runs the pool as an unprivileged uid: needs root, setpriv, a system Python")
    uid = 2_100_000_000 + os.getpid() % 10_000_000
    work_root = tempfile.mkdtemp(prefix="sbx-leftovers-")
    os.chown(work_root, uid, uid)
    site = sysconfig.get_paths()["purelib"]
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python,
               "-m", "tests.security.nonroot_pool", work_root, site]  # fmt: skip
    try:
        yield uid, command
    finally:
        iso.kill_all_of_uid(uid)  # whatever this test found left, or left itself
        shutil.rmtree(work_root, ignore_errors=True)


def _start(command: list[str], mode: str) -> subprocess.Popen[str]:
    site = command[-1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    return subprocess.Popen([*command, mode], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip


@pytest.mark.timeout(180)
def test_a_killed_zygotes_executions_die_with_it(as_unprivileged: tuple[int, list[str]]) -> None:
    uid, command = as_unprivileged
    proc = _start(command, "kill")
    try:
        events = _events(proc)
        steps = {}
        for event in events:
            steps[event["step"]] = event
            if event["step"] == "recovered":
                break
        assert "crashed" in steps, steps
        recovered = steps["recovered"]
        pool = {recovered["service"], *recovered["zygotes"]}
        left = {pid: cmd for pid, cmd in _alive_of(uid).items() if pid not in pool}
        assert left == {}  # the sleeper it double-forked is gone too
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert [e["step"] for e in events] == ["stopped"]
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert _settled(uid) == {}


@pytest.mark.timeout(180)
def test_a_shutdown_mid_run_leaves_no_process(as_unprivileged: tuple[int, list[str]]) -> None:
    uid, command = as_unprivileged
    proc = _start(command, "stop")
    try:
        assert [e["step"] for e in _events(proc)] == ["running", "stopped"]
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert _settled(uid) == {}
