"""A service of the load tests' own: its own uids and work root, so the adversarial workload's
fork bombs count against no other service's process limit on a shared host."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_service.launch import ServiceProcess, start

# Slot uids are per host: RLIMIT_NPROC counts every process of a uid, whichever service runs it.
UID_BASE = 64000


@pytest.fixture(scope="session")
def own_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    base = tmp_path_factory.mktemp("loadtest-svc")
    svc = start(
        str(base / "service.log"),
        slots=2,
        uid_base=UID_BASE,
        work_root=str(base / "work"),
        max_timeout_s=30,
    )
    yield svc
    svc.stop()
