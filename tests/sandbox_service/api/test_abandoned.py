"""Work whose client went away is dropped: verl's way of giving up (a read timeout, the
connection closed) on 100 CPU-bound 10 s programs, and a batch over ``max_batch`` on the
code-judge front refused whole."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.service_process import ServiceProcess, start
from tests.sandbox_service.redis_helpers import RedisServer

SPIN = "while True: pass"


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("abandoned") / "service.log"
    svc = start(str(log), slots=2, preload="math", max_batch=8, max_timeout_s=30)
    yield svc
    svc.stop()


async def _give_up_after(url: str, bodies: list[Any], path: str, after_s: float) -> int:
    """Send every body at once on its own connection; close them all after ``after_s``."""
    limits = httpx.Limits(max_connections=len(bodies) + 10)
    async with httpx.AsyncClient(limits=limits, timeout=after_s) as http:
        sent = await asyncio.gather(
            *(http.post(f"{url}{path}", json=b) for b in bodies), return_exceptions=True
        )
    return sum(isinstance(s, httpx.TimeoutException) for s in sent)


def _status(url: str) -> dict[str, object]:
    status: dict[str, object] = httpx.get(f"{url}/v1/status", timeout=30).json()
    return status


def _abandon_spinners(url: str, count: int, mode: str) -> dict[str, object]:
    """``count`` CPU-bound 10 s /run_code requests sent at once and given up after 3 s (verl's
    way); waits for the queue to empty and for a new print(1), prints how long each took, and
    returns the status read once the queue was empty."""
    body = {"code": SPIN, "language": "python", "run_timeout": 10}
    timed_out = asyncio.run(_give_up_after(url, [body] * count, "/run_code", 3.0))
    gone = time.monotonic()
    assert timed_out == count
    deadline = gone + 30  # room for a loaded machine; the figures are printed
    while time.monotonic() < deadline:
        status = _status(url)
        if status["queue_depth"] == 0 and status["in_flight"] == 0:
            break
        time.sleep(0.05)
    emptied = time.monotonic() - gone
    assert status["queue_depth"] == 0 and status["in_flight"] == 0, status
    answer = httpx.post(f"{url}/v1/execute", json={"code": "print(1)"}, timeout=60).json()
    answered = time.monotonic() - gone
    assert answer["status"] == "ok" and answer["stdout"] == "1\n"
    print(f"{mode}, {count} given up: queue empty {emptied:.2f} s after the client left; "
          f"print(1) answered at {answered:.2f} s")  # fmt: skip
    return status


def test_a_client_that_gives_up_leaves_nothing_running(two_slots: ServiceProcess) -> None:
    url = two_slots.url
    status = _abandon_spinners(url, 100, "embedded")
    dropped = status["dropped"]
    assert isinstance(dropped, dict)
    assert dropped.get("running") == 2 and dropped.get("queued", 0) == 98
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'sandbox_dropped_total{where="queued"} 98.0' in metrics
    # Dropped work is never an execution: none of it was answered as one.
    assert "timeout" not in status["executions"]  # type: ignore[operator]


def test_a_job_joined_by_id_keeps_running(two_slots: ServiceProcess) -> None:
    """One client leaves; another waits for the same id: the job runs on and both see it."""
    url = two_slots.url
    request = {"code": "import time; time.sleep(2); print('done')", "id": "shared-1"}

    async def both() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as patient:
            stays = asyncio.create_task(patient.post(f"{url}/v1/execute", json=request))
            await asyncio.sleep(0.3)
            leaves = await _give_up_after(url, [request], "/v1/execute", 0.5)
            assert leaves == 1
            return await stays

    answer = asyncio.run(both()).json()
    assert answer["status"] == "ok" and answer["stdout"] == "done\n"


def test_code_judge_batch_over_max_batch_is_refused_whole(two_slots: ServiceProcess) -> None:
    subs = [{"type": "python", "solution": f"print({i})"} for i in range(9)]
    before = _status(two_slots.url)["executions"]
    for path in ("/run/batch", "/run/long-batch", "/judge/batch"):
        answer = httpx.post(f"{two_slots.url}{path}", json={"submissions": subs}, timeout=60)
        assert answer.status_code == 422, answer.text
        [detail] = answer.json()["detail"]
        assert detail["loc"] == ["body", "submissions"] and detail["ctx"]["limit"] == 8
        assert "at most 8 per batch" in detail["msg"]
    assert _status(two_slots.url)["executions"] == before  # nothing ran
    ok = httpx.post(f"{two_slots.url}/run/batch", json={"submissions": subs[:8]}, timeout=60)
    assert [r["stdout"] for r in ok.json()["results"]] == [f"{i}\n" for i in range(8)]


def test_dropped_jobs_of_a_batch(two_slots: ServiceProcess, tmp_path: Path) -> None:
    """The native batch: a client that leaves takes its whole batch's queued jobs with it."""
    url = two_slots.url
    before = _status(url)["dropped"]
    assert isinstance(before, dict)
    body = {"requests": [{"code": SPIN, "timeout_s": 20}] * 8}
    asyncio.run(_give_up_after(url, [body], "/v1/execute/batch", 1.0))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = _status(url)
        if status["queue_depth"] == 0 and status["in_flight"] == 0:
            break
        time.sleep(0.05)
    dropped = status["dropped"]
    assert isinstance(dropped, dict)
    assert sum(dropped.values()) - sum(before.values()) == 8


def test_run_code_that_cannot_start_within_its_budget_answers_504(tmp_path: Path) -> None:
    """One slot held by a long program: a /run_code whose run_timeout + slack passes before it
    can start is answered 504 (verl's client retries it), not left to time out."""
    svc = start(str(tmp_path / "log"), slots=1, preload="math", sandboxfusion_start_slack_s=0.5)
    try:
        with httpx.Client(timeout=60) as http:
            holder = {"code": "import time; time.sleep(6)", "language": "python", "run_timeout": 10}

            async def both() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=60) as ahttp:
                    held = asyncio.create_task(ahttp.post(f"{svc.url}/run_code", json=holder))
                    await asyncio.sleep(0.5)
                    late = {"code": "print(1)", "language": "python", "run_timeout": 1}
                    return [await ahttp.post(f"{svc.url}/run_code", json=late), await held]

            late, held = asyncio.run(both())
            assert late.status_code == 504, late.text
            assert "busy" in late.json()["detail"] and late.headers["Retry-After"]
            assert held.json()["status"] == "Success"
            again = http.post(
                f"{svc.url}/run_code", json={"code": "print(1)", "language": "python"}
            ).json()
            assert again["run_result"]["stdout"] == "1\n"
    finally:
        svc.stop()


def test_redis_mode_drops_what_a_gone_client_left(
    redis_server: RedisServer, prefix: str, tmp_path: Path
) -> None:
    """The same in Redis mode: the API node drops the chunks no worker took, and tells the
    worker (through the heartbeat's round trip) to drop what it holds and kill what it runs."""
    common: dict[str, Any] = {"redis_url": redis_server.url, "redis_prefix": prefix, "preload": "math",
              "warmup": "", "heartbeat_interval_s": 0.3, "max_timeout_s": 30}  # fmt: skip
    api = start(str(tmp_path / "api.log"), command=("api",), **common)
    worker = start(str(tmp_path / "worker.log"), command=("worker",), port_setting="worker_metrics_port",
                   slots=2, uid_base=random.randrange(20_000, 60_000, 256), **common)  # fmt: skip
    try:
        _abandon_spinners(api.url, 40, "Redis mode")
        metrics = httpx.get(f"{worker.url}/metrics", timeout=30).text
        assert 'sandbox_dropped_total{where="running"} 2.0' in metrics
        assert "timeout" not in _status(api.url)["executions"]  # type: ignore[operator]
    finally:
        worker.stop()
        api.stop()
