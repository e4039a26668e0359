"""Stragglers in a real service: hung programs hold slots, not cores, and a program starved of
CPU by them gets its wall-clock limit extended by the time it waited (one CPU: ``taskset``)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import httpx
import pytest

from sandbox_service.service_process import ServiceProcess, start

SPIN = "while True:\n    pass"
# Exactly 0.3 s of its own CPU, however long that takes on a shared core.
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\nprint('done')"

pytestmark = pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")


@pytest.fixture(scope="module")
def one_cpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service pinned to one CPU (so cores defaults to 1), with four slots, and wall-clock
    limits extended by the time a program waited for the CPU (up to 3 x timeout_s more)."""
    log = tmp_path_factory.mktemp("stragglers") / "service.log"
    service = start(str(log), python=("taskset", "-c", "0", sys.executable), slots=4,
                    straggler_after_s=0.05, starved_extension=3, light_zygote=False)  # fmt: skip
    yield service
    service.stop()


def _batch(url: str, requests: list[dict[str, object]]) -> list[dict[str, object]]:
    response = httpx.post(f"{url}/v1/execute/batch", json={"requests": requests}, timeout=60)
    response.raise_for_status()
    results: list[dict[str, object]] = response.json()["results"]
    return results


def test_short_programs_do_not_wait_behind_hung_ones(one_cpu: ServiceProcess) -> None:
    status = httpx.get(f"{one_cpu.url}/v1/status").json()
    assert status["workers"][0]["cores"] == 1 and status["workers"][0]["slots"] == 4
    hung: list[dict[str, object]] = [{"code": SPIN, "timeout_s": 1.5}] * 3
    short: list[dict[str, object]] = [{"code": f"print({i})"} for i in range(10)]
    results = _batch(one_cpu.url, hung + short)
    assert [r["status"] for r in results[:3]] == ["timeout"] * 3
    assert [r["stdout"] for r in results[3:]] == [f"{i}\n" for i in range(10)]
    # One slot per core would have made them wait for a hung program's 1.5 s (or more) first.
    assert all(float(str(r["queue_time_s"])) < 1.5 for r in results[3:])


def test_a_program_starved_by_stragglers_is_not_judged_timeout_for_their_use(
    one_cpu: ServiceProcess,
) -> None:
    """Two spinners share the one CPU with a program that needs 0.3 s of it under a 0.6 s
    limit: it gets about a third of the core, waits the rest, and the wait is not held
    against it."""
    spinners = [{"code": SPIN, "timeout_s": 1.5}] * 2
    busy = {"code": BUSY, "timeout_s": 0.6}
    *_, result = _batch(one_cpu.url, [*spinners, busy])
    assert result["status"] == "ok", result
    assert result["stdout"] == "done\n"
    assert float(str(result["wall_time_s"])) > 0.6  # it ran past 0.6 s of wall clock ...
    assert float(str(result["cpu_time_s"])) < 0.6  # ... having used less than that of CPU


def test_a_spinning_program_still_times_out_at_its_own_limit(one_cpu: ServiceProcess) -> None:
    [result] = _batch(one_cpu.url, [{"code": SPIN, "timeout_s": 0.5}])
    assert result["status"] == "timeout"
    assert float(str(result["wall_time_s"])) < 0.5 * (1 + 3) + 0.5  # at most the extension
