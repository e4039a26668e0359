"""After an attack: every zygote of every slot (full and light) still answers correctly.

The light zygote runs programs that import only the standard library, the full one the rest;
programs that overlap in time land on different slots. So a batch of overlapping programs of
both kinds reaches them all, and the per-zygote execution counts prove that it did. They sleep
long enough that all of them have started (two per ``straggler_after_s`` on two cores) before
the first ends: a freed core goes to the slot that finished last, which would otherwise run
the rest of the batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import ServiceProcess, start

# Placed on the full zygote (numpy) or the light one (standard library only).
ZYGOTES = {"full": "import numpy\n", "light": ""}


def assert_every_slot_answers(client: SandboxClient, after: str) -> None:
    """Each zygote runs at least one program and answers it correctly; names ``after``."""
    before = client.status()
    zygotes = len(before.slots) + len(before.light_slots)
    counts = {s.pid: s.executions for s in before.slots + before.light_slots}
    for _ in range(5):  # slots are given out by whoever is free first: retry until all ran
        n = len(before.slots)
        codes = [light_prefix(n) + f"print(sum(range({100 + i})))" for i in range(n)] + [
            full_prefix(n) + f"print(int(numpy.arange({100 + i}).sum()))" for i in range(n)
        ]
        results = client.execute_batch(codes)
        for i, r in enumerate(results):
            expected = f"{sum(range(100 + i % n))}\n"
            assert r.status is Status.ok and r.stdout == expected, (
                f"after {after!r}: a slot answered {r.status.value} {r.stdout!r} {r.stderr[-300:]!r}"
            )
        now = client.status()
        ran = {s.pid for s in now.slots + now.light_slots if s.executions > counts.get(s.pid, 0)}
        if len(ran) == zygotes:
            return
    raise AssertionError(f"after {after!r}: not every zygote could be reached ({ran})")


def overlap_s(slots: int) -> float:
    """How long each program of a batch of two per slot sleeps so that all of them run at
    once: a core token goes to the slot that finished last, so programs that end before the
    rest have started would bring the rest back to the same few zygotes."""
    return 0.3 + 0.05 * slots


def full_prefix(slots: int) -> str:
    """Runs on the full zygote (numpy), long enough to overlap a batch of two per slot."""
    return f"import numpy, time\ntime.sleep({overlap_s(slots)})\n"


def light_prefix(slots: int) -> str:
    return f"import time\ntime.sleep({overlap_s(slots)})\n"


def suite_slots() -> int:
    """The slots of the suite's shared services: 2, or ``SANDBOX_SECURITY_SLOTS`` (to run the
    suite at the default's 8 per CPU, with core tokens apart from slots: issue 31). Modules
    that ask for one slot keep it: they need the next run on the same zygote."""
    return int(os.environ.get("SANDBOX_SECURITY_SLOTS", "2"))


def serve(tmp_path_factory: pytest.TempPathFactory, name: str, **settings: Any,
          ) -> Iterator[ServiceProcess]:  # fmt: skip
    """A service of this test module's own (``suite_slots`` unless told), stopped after it."""
    settings = {"slots": suite_slots(), "max_timeout_s": 30, **settings}
    svc = start(str(tmp_path_factory.mktemp(name) / "service.log"), **settings)
    yield svc
    svc.stop()


def client_of(service: ServiceProcess) -> Iterator[SandboxClient]:
    with SandboxClient(service.url, retry=Retry(attempts=1)) as c:
        yield c


def module_service(name: str, **settings: Any) -> tuple[Any, Any]:
    """The ``service`` and ``client`` fixtures of a test module with a service of its own:
    ``service, client = module_service("name", slots=1)``."""

    @pytest.fixture(scope="module")
    def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
        yield from serve(tmp_path_factory, name, **settings)

    @pytest.fixture(scope="module")
    def client(service: ServiceProcess) -> Iterator[SandboxClient]:
        yield from client_of(service)

    return service, client
