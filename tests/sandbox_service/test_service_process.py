"""An embedded service started to die with its starter does, however the starter ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STARTER = """
import sys, time
from sandbox_service.service_process import start
service = start(sys.argv[1], slots=1, light_zygote=False, die_with_starter=sys.argv[2] == "1")
print(service.process.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("dies", [True, False], ids=["die-with-starter", "default"])
def test_a_service_outlives_a_killed_starter_only_if_asked(tmp_path: Path, dies: bool) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "service.log"), "1" if dies else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    service = int(starter.stdout.readline())
    try:
        starter.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel acts
        starter.wait()
        deadline = time.monotonic() + 30
        while not _gone(service) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(service) is dies
    finally:
        if not _gone(service):
            os.kill(service, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not _gone(service) and time.monotonic() < deadline:
                time.sleep(0.1)
