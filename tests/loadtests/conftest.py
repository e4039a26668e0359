"""A service of the load tests' own, with its own work root; ``launch`` gives it slot uids no
other service on the machine uses, so the adversarial workload's fork bombs count against no
one else's process limit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandbox_service.service_process import ServiceProcess, start
from tests.loadtests.forker import FORKER


@pytest.fixture(scope="session")
def own_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    base = tmp_path_factory.mktemp("loadtest-svc")
    svc = start(
        str(base / "service.log"),
        slots=2,
        work_root=str(base / "work"),
        max_timeout_s=30,
    )
    yield svc
    svc.stop()


@pytest.fixture
def forker() -> Iterator[subprocess.Popen[str]]:
    """A parent of four CPU-burning children: write a line to start it, read "done"."""
    proc = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)
