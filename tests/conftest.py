"""Shared fixtures: real services started as real processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.service_process import ServiceProcess, start
from tests.helpers import SECRET


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
