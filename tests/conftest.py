"""Shared fixtures: real services started as real processes on loopback."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.launch import ServiceProcess, start

SECRET = "hunter2-do-not-leak"


def wait_until_admitted(url: str, jobs: int, timeout_s: float = 20) -> None:
    """Block until the service holds at least ``jobs`` jobs (waiting or running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = httpx.get(f"{url}/v1/status").json()
        if report["queue_depth"] + report["in_flight"] >= jobs:
            return
        time.sleep(0.02)
    raise AssertionError(f"{jobs} jobs were never admitted")


def processes_of(uids: set[int | None]) -> list[int]:
    """Pids of every process whose owner is one of ``uids`` (a slot's leftovers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(int(entry))
            except FileNotFoundError:
                continue
    return found


@contextlib.contextmanager
def queue_held_full(url: str, jobs: int = 3) -> Iterator[None]:
    """While inside, the service holds ``jobs`` one-second jobs (a full tight_service)."""
    slow = {"requests": [{"code": "import time; time.sleep(1)", "timeout_s": 5}] * jobs}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, f"{url}/v1/execute/batch", json=slow, timeout=30)
        wait_until_admitted(url, jobs)
        yield
        running.result()


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The embedded service as users run it (default preloads), with a secret in its env."""
    log = tmp_path_factory.mktemp("svc") / "service.log"
    svc = start(
        str(log),
        extra_env={"SERVICE_SECRET_TOKEN": SECRET},
        slots=2,
        max_output_bytes=65536,
        max_timeout_s=30,
    )
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def client(service: ServiceProcess) -> Iterator[SandboxClient]:
    with SandboxClient(service.url, retry=Retry(attempts=3, backoff_s=0.05)) as c:
        yield c


@pytest.fixture(scope="session")
def tight_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One slot and small limits, to reach every limit quickly."""
    log = tmp_path_factory.mktemp("tight") / "service.log"
    svc = start(
        str(log),
        slots=1,
        preload="math",
        max_queue_depth=3,
        max_queue_wait_s=0.5,
        max_batch=4,
        max_timeout_s=5,
        max_memory_mb=2048,
        max_code_chars=1000,
        max_stdin_chars=1000,
        max_files_bytes=1000,
    )
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def compat_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """For the compatibility fronts, sessions and the integration docs: small limits that
    the tests reach quickly (code-judge's time limit, a session's cells and idle time)."""
    log = tmp_path_factory.mktemp("compat") / "service.log"
    svc = start(
        str(log),
        slots=2,
        preload="math,numpy",
        max_timeout_s=30,
        max_output_bytes=65536,
        codejudge_timeout_s=1,
        codejudge_max_output_chars=100,
        session_max_cells=4,
        session_ttl_s=3,
    )
    yield svc
    svc.stop()
