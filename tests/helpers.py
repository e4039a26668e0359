"""Helpers the tests share: what a slot left behind, and a service's queue held full."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet

import httpx

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


def processes_of(uids: AbstractSet[int | None]) -> list[int]:
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
