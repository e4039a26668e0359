"""A zygote that cannot start says why, in its own words (the step, the call, its errno), in
the log, in each slot's ``last_error`` on /v1/status, and in /readyz's reason; the service
stays up, not ready, retrying with backoff, instead of reporting ``IncompleteReadError``.

The failure is forced without a container: a work root under /proc, where no directory can
be made, with the mount layer off (so the zygote prepares the work root itself)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from sandbox_service.service_process import start


@pytest.mark.skipif(os.geteuid() != 0, reason="the pid namespace's own /proc needs root")
def test_a_zygote_that_cannot_start_names_its_cause(tmp_path: Path) -> None:
    service = start(str(tmp_path / "service.log"), wait_for="/healthz", slots=1,
                    light_zygote=False, preload="math", disable_isolation="mount",
                    work_root="/proc/sandbox-cannot-be-made")  # fmt: skip
    try:
        ready = httpx.get(f"{service.url}/readyz", timeout=10)
        assert ready.status_code == 503
        reason = ready.json()["reason"]
        # e.g. "working directory: FileNotFoundError: ENOENT (No such file or ...): /proc/..."
        cause = reason.split("zygote cannot start: working directory: ", 1)[1]
        assert "/proc/sandbox-cannot-be-made" in cause
        assert any(f"{code} (" in cause for code in ("ENOENT", "EACCES", "EPERM")), reason
        [slot] = httpx.get(f"{service.url}/v1/status", timeout=10).json()["slots"]
        assert slot["healthy"] is False and slot["failures"] >= 1
        assert "zygote cannot start: working directory: " in slot["last_error"], slot
        assert "working directory: " in service.log()
    finally:
        service.stop()
