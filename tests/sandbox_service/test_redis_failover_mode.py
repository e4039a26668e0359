"""Redis mode across a Sentinel failover, end to end: two API nodes and two worker nodes (real
processes) following a primary, a replica and three Sentinels; the primary SIGKILLed while
batches are in flight. ``python -m loadtests.faults --faults failover`` is the long version.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.cluster import Cluster
from sandbox_service.sentinel_process import available

pytestmark = pytest.mark.skipif(
    not available(),
    reason="needs Debian's redis-server and redis-sentinel (apt-get install redis-sentinel; "
    "CI installs them)",
)

FAST = {"preload": "math", "warmup": "", "heartbeat_interval_s": 0.3, "visibility_timeout_s": 3}
BATCHES, SIZE = 48, 8


class Load:
    """Batches with ids sent to both API nodes; an outage (503, a broken connection) is
    retried with the same ids, and items answered ``rejected`` are sent again, as the
    Python client does. Counts what came back how."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.answers: dict[str, dict[str, Any]] = {}
        self.first: Counter[str] = Counter()  # first answer of each request, by status
        self.retries: Counter[str] = Counter()
        self.lost_messages: list[str] = []
        self.done = 0
        self.killed_at: float | None = None
        self.recovered_s: float | None = None
        self.lock = threading.Lock()

    def post(self, n: int, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        while True:
            sent = time.monotonic()
            try:
                response = httpx.post(f"{self.urls[n % 2]}/v1/execute/batch",
                                      json={"requests": requests}, timeout=120)  # fmt: skip
            except httpx.TransportError:
                self.retries["connection"] += 1
            else:
                if response.status_code == 200:
                    with self.lock:
                        after = self.killed_at is not None and sent > self.killed_at
                        if after and self.recovered_s is None and self.killed_at is not None:
                            self.recovered_s = time.monotonic() - self.killed_at
                    return response.json()["results"]  # type: ignore[no-any-return]
                assert response.status_code == 503, response.text
                self.retries["503"] += 1
            time.sleep(0.1)

    def batch(self, n: int) -> None:
        todo = [{"code": f"print({n} * 1000 + {i})", "id": f"r{n}-{i}"} for i in range(SIZE)]
        first = True
        while todo:
            results = self.post(n, todo)
            assert [r["id"] for r in results] == [r["id"] for r in todo]  # each its own answer
            again = []
            for request, result in zip(todo, results, strict=True):
                if first:
                    self.first[result["status"]] += 1
                if result["status"] == "rejected":
                    self.lost_messages.append(result["message"])
                    again.append(request)
                else:
                    assert request["id"] not in self.answers, "answered twice"
                    self.answers[request["id"]] = result
            todo, first = again, False
        with self.lock:
            self.done += 1


def test_sigkill_of_the_primary_under_load_answers_every_request_once(tmp_path: Path) -> None:
    with Cluster(str(tmp_path), 2, 2, 1, FAST, sentinel=True) as cluster:
        assert cluster.group is not None
        load = Load(cluster.urls)
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            pending = [pool.submit(load.batch, n) for n in range(BATCHES)]
            deadline = time.monotonic() + 60
            while load.done < BATCHES // 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            load.killed_at = time.monotonic()
            promoted_s = cluster.fail_over()
            for future in pending:
                future.result(timeout=180)
        assert len(load.answers) == BATCHES * SIZE  # every request answered, once
        for n in range(BATCHES):
            for i in range(SIZE):
                result = load.answers[f"r{n}-{i}"]
                assert result["status"] == "ok", result  # none wrong
                assert result["stdout"] == f"{n * 1000 + i}\n", result
        assert set(load.first) <= {"ok", "rejected"}, load.first
        assert all("lost this request in a failover" in m or "lost the queue" in m
                   for m in load.lost_messages)  # fmt: skip
        print(f"\nfailover under load: {BATCHES * SIZE} requests, first answers "
              f"{dict(load.first)}, retries {dict(load.retries)}, promoted in "
              f"{promoted_s:.2f} s, first admission after the kill "
              f"{load.recovered_s or 0:.2f} s after it", file=sys.stderr)  # fmt: skip
        report = httpx.get(f"{cluster.urls[0]}/v1/status", timeout=10).json()
        deadline = time.monotonic() + 30
        while report["queue_depth"] and time.monotonic() < deadline:
            time.sleep(0.2)
            report = httpx.get(f"{cluster.urls[0]}/v1/status", timeout=10).json()
        assert report["queue_depth"] == 0 and len(report["workers"]) == 2
