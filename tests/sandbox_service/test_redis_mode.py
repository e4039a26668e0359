"""Redis mode end to end: real API node and worker node processes sharing a real Redis.

Each test starts its own nodes under its own key prefix, kills or stops them as an operator
or a crash would, and checks that every request is answered, correctly and once.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.queue.redis.producer import LOST_ADVICE
from sandbox_service.service_process import LaunchError, ServiceProcess, start
from tests.sandbox_service.redis_helpers import RedisServer

FAST = {"preload": "math", "warmup": "", "heartbeat_interval_s": 0.3, "visibility_timeout_s": 2}

# Kills the worker that runs it (its zygote's parent), as a bug in the executor might let a
# program do. Needs the uid layer off, so that the program runs as the worker's own user.
POISON = """
import os, signal
def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
os.kill(parent(os.getppid()), signal.SIGKILL)
"""


@dataclass
class Deployment:
    """API and worker nodes of one test, on one Redis, under the test's own key prefix."""

    redis: RedisServer
    prefix: str
    logs: Path
    settings: dict[str, Any] = field(default_factory=dict)
    processes: list[ServiceProcess] = field(default_factory=list)
    numbers: Iterator[int] = field(default_factory=itertools.count)
    uid_base: int = field(default_factory=lambda: random.randrange(20_000, 60_000, 256))

    def _start(self, kind: str, flags: tuple[str, ...], **settings: Any) -> ServiceProcess:
        name = f"{kind}-{next(self.numbers)}"
        options = {**FAST, **self.settings, **settings}
        port = "worker_metrics_port" if kind == "worker" else "port"
        process = start(str(self.logs / f"{name}.log"), command=(kind, *flags), port_setting=port,
                        redis_url=self.redis.url, redis_prefix=self.prefix, **options)  # fmt: skip
        self.processes.append(process)
        return process

    def api(self, **settings: Any) -> ServiceProcess:
        return self._start("api", (), **settings)

    def worker(self, **settings: Any) -> ServiceProcess:
        # Slots run code as uid_base + slot, and a zygote that starts kills every process of
        # its uid: workers sharing a host must not share uids (nor share them with anything
        # else on this machine that runs the default 61000).
        uid_base = self.uid_base + 4 * next(self.numbers)
        return self._start("worker", (), **{"slots": 1, "uid_base": uid_base, **settings})

    def many(self, *starters: Callable[[], ServiceProcess]) -> list[ServiceProcess]:
        """Start several nodes at once (each waits for its own /readyz)."""
        with concurrent.futures.ThreadPoolExecutor(len(starters)) as pool:
            return list(pool.map(lambda starter: starter(), starters))

    def env(self, **settings: Any) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        options = {**FAST, **self.settings, **settings,
                   "redis_url": self.redis.url, "redis_prefix": self.prefix}  # fmt: skip
        env.update({f"SANDBOX_{k.upper()}": str(v) for k, v in options.items()})
        return env

    def stop(self) -> None:
        for process in self.processes:
            process.stop(timeout_s=20)


@pytest.fixture
def deployment(redis_server: RedisServer, prefix: str, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(redis_server, prefix, tmp_path)
    yield d
    d.stop()


def post(url: str, codes: list[str], timeout: float = 60, **fields: Any) -> httpx.Response:
    batch = {"requests": [{"code": code, **fields} for code in codes]}
    return httpx.post(f"{url}/v1/execute/batch", json=batch, timeout=timeout)


def status(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/status", timeout=10).json()  # type: ignore[no-any-return]


def outputs(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert {r["status"] for r in results} == {"ok"}, [
        (r["worker"], r["message"], r["wall_time_s"]) for r in results if r["status"] != "ok"
    ][:2]
    return [r["stdout"] for r in results]


def test_results_correct_and_in_order_across_two_api_nodes_and_two_workers(
    deployment: Deployment,
) -> None:
    d = deployment
    a, b, w1, _ = d.many(d.api, d.api, lambda: d.worker(worker_name="w1"),
                         lambda: d.worker(worker_name="w2"))  # fmt: skip
    batches = [[f"print({n} * 1000 + {i})" for i in range(40)] for n in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda n: post((a, b)[n % 2].url, batches[n]), range(8)))
    for n, response in enumerate(responses):
        assert outputs(response) == [f"{n * 1000 + i}\n" for i in range(40)]
    workers = {r["worker"].split("/")[0] for resp in responses for r in resp.json()["results"]}
    assert workers == {"w1", "w2"}
    report = status(b.url)
    assert report["mode"] == "redis" and sorted(w["name"] for w in report["workers"]) == [
        "w1",
        "w2",
    ]
    assert report["executions"] == {"ok": 320} and report["queue_depth"] == 0
    assert httpx.get(f"{w1.url}/healthz").status_code == 200  # the worker's own port
    metrics = httpx.get(f"{w1.url}/metrics").text
    assert 'sandbox_executions_total{status="ok"}' in metrics
    assert "sandbox_redis_round_trips_total" in metrics and "sandbox_slots 1.0" in metrics


def test_api_and_worker_commands_document_their_settings() -> None:
    for command, expected in (("api", "--redis-url"), ("worker", "--burst")):
        out = subprocess.run([sys.executable, "-m", "sandbox_service.cli", command, "--help"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert expected in out and "--visibility-timeout-s" in out and "SANDBOX_" in out


def test_sigkill_of_a_worker_mid_run_loses_nothing_and_answers_nothing_twice(
    deployment: Deployment,
) -> None:
    d = deployment
    api, w1, _ = d.many(d.api, lambda: d.worker(worker_name="w1"),
                        lambda: d.worker(worker_name="w2"))  # fmt: skip
    codes = [f"print({i})" for i in range(2000)]
    batches = [codes[i : i + 100] for i in range(0, 2000, 100)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(post, api.url, batch, 120) for batch in batches]
        deadline = time.monotonic() + 20
        while status(api.url)["executions"].get("ok", 0) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        w1.process.kill()  # mid-run: it holds chunks it has not settled
        responses = [p.result() for p in pending]
    got = [out for response in responses for out in outputs(response)]
    assert got == [f"{i}\n" for i in range(2000)]  # all answered, right, in order, once each
    report = status(api.url)
    assert report["reclaimed"] >= 1 and [w["name"] for w in report["workers"]] == ["w2"]
    assert report["queue_depth"] == 0


def test_poison_job_ends_as_internal_error_and_spares_its_chunk(deployment: Deployment) -> None:
    d = deployment
    d.settings = {"max_attempts": 2, "visibility_timeout_s": 1, "heartbeat_interval_s": 0.2}
    # The poison kills its worker node: only possible without a slot uid and without a pid
    # namespace (in one, the worker is beyond the zygote, pid 1, and cannot be named).
    api, first = d.many(d.api, lambda: d.worker(disable_isolation="uid,pid"))
    deaths = []
    done = threading.Event()

    def supervise(worker: ServiceProcess | None) -> None:  # what Kubernetes does for a pod
        while not done.is_set():
            if worker is None or worker.process.poll() is not None:
                deaths.append(worker.process.returncode if worker else "while starting")
                try:
                    worker = d.worker(disable_isolation="uid,pid")
                except LaunchError:  # killed before it said it was ready
                    worker = None
            time.sleep(0.05)

    supervisor = threading.Thread(target=supervise, args=(first,))
    supervisor.start()
    try:
        response = post(api.url, [POISON, "print('a')", "print('b')"], timeout=60)
    finally:
        done.set()
        supervisor.join()
    poison, a, b = response.json()["results"]
    assert (a["status"], a["stdout"], b["status"], b["stdout"]) == ("ok", "a\n", "ok", "b\n")
    assert poison["status"] == "internal_error"
    assert "vanished 2 times" in poison["message"] and "max_attempts=2" in poison["message"]
    assert len(deaths) == 2  # it killed two workers, then it was not run again


def test_resubmitted_id_returns_the_stored_result_on_any_api_node(deployment: Deployment) -> None:
    d = deployment
    a, b, _ = d.many(d.api, d.api, d.worker)
    first = post(a.url, ["import random; print(random.random())"], id="r1")
    again = post(b.url, ["import random; print(random.random())"], id="r1")
    assert outputs(first) == outputs(again)
    slow = ["import random, time; time.sleep(0.5); print(random.random())"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both while it runs: joined
        both = list(pool.map(lambda url: post(url, slow, id="r2"), (a.url, b.url)))
    assert outputs(both[0]) == outputs(both[1])
    assert status(a.url)["executions"] == {"ok": 2}  # four submissions, two executions


def test_full_queue_answers_429_with_retry_after(deployment: Deployment) -> None:
    api = deployment.api(max_queue_depth=4, retry_after_s=2, max_queue_wait_s=1.5)  # no worker
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, api.url, ["print(1)"] * 3)
        time.sleep(0.5)
        refused = post(api.url, ["print(2)"] * 2)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
        assert "queue is full" in refused.json()["detail"]
        statuses = {r["status"] for r in waiting.result().json()["results"]}
    assert statuses == {"queue_timeout"}  # no worker: answered by the API node itself
    metrics = httpx.get(f"{api.url}/metrics").text
    assert 'sandbox_http_refused_total{code="429"} 1.0' in metrics


def test_job_not_started_by_its_deadline_is_answered_queue_timeout(deployment: Deployment) -> None:
    d = deployment
    d.settings = {"max_queue_wait_s": 0.5}
    api, _ = d.many(d.api, d.worker)
    # One slot: the second job waits in the worker's hands past its deadline.
    response = post(api.url, ["import time; time.sleep(1.2); print(1)", "print(2)"])
    first, second = response.json()["results"]
    assert first["status"] == "ok"
    assert second["status"] == "queue_timeout" and second["stdout"] == ""
    assert "not started within 0.5 s" in second["message"] and second["queue_time_s"] >= 0.5


def test_redis_stopped_and_restarted_mid_run(
    own_redis: RedisServer, prefix: str, tmp_path: Path
) -> None:
    d = Deployment(own_redis, prefix, tmp_path)
    try:
        api, worker = d.many(d.api, lambda: d.worker(slots=2))
        _redis_outage(own_redis, api, worker)
    finally:
        d.stop()


def _redis_outage(redis: RedisServer, api: ServiceProcess, worker: ServiceProcess) -> None:
    records: list[tuple[float, float, httpx.Response]] = []
    restarted = threading.Event()

    def client() -> None:  # sends batches until five in a row worked after the restart
        n, streak, deadline = 0, 0, time.monotonic() + 40
        while streak < 5 and time.monotonic() < deadline:
            sent = time.monotonic()
            codes = [f"import time; time.sleep(0.02); print({n * 100 + i})" for i in range(10)]
            response = post(api.url, codes, timeout=30)
            records.append((sent, time.monotonic() - sent, response))
            ok = response.status_code == 200 and {
                r["status"] for r in response.json()["results"]
            } == {"ok"}
            streak = streak + 1 if restarted.is_set() and ok else 0
            n += 1
            time.sleep(0.05)

    thread = threading.Thread(target=client)
    thread.start()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        time.sleep(1.0)
        running = pool.submit(post, api.url, ["import time; time.sleep(3); print(1)"], 30)
        time.sleep(0.5)
        redis.stop()
        time.sleep(1.5)
        for url in (api.url, worker.url):  # both say why they cannot take work
            probe = httpx.get(f"{url}/readyz", timeout=5)
            assert probe.status_code == 503 and "unreachable" in probe.json()["reason"]
        refused = post(api.url, ["print(1)"], timeout=5)  # new work: refused at once, clearly
        assert refused.status_code == 503 and "queue is unreachable" in refused.json()["detail"]
        redis.start()
        restarted.set()
        [lost] = running.result().json()["results"]  # Redis came back without it: said so
    # the restart is seen by the epoch check or by the lost-writes check, whichever runs first
    assert lost["status"] == "rejected" and LOST_ADVICE in lost["message"]
    thread.join()
    codes = [response.status_code for _, _, response in records]
    assert codes[-5:] == [200] * 5  # recovered, with the same processes
    for _, elapsed, response in records:
        assert elapsed < 15  # nothing hangs
        if response.status_code == 503:
            assert "queue is unreachable" in response.json()["detail"]
            continue
        assert response.status_code == 200
        for result in response.json()["results"]:
            assert result["status"] in ("ok", "rejected"), result
            if result["status"] == "rejected":
                assert LOST_ADVICE in result["message"]
    for url in (api.url, worker.url):
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def test_sigterm_on_worker_and_api_node_loses_nothing(deployment: Deployment) -> None:
    d = deployment
    d.settings = {"visibility_timeout_s": 60, "graceful_shutdown_s": 10}  # no reclaiming here
    api, w1, _ = d.many(d.api, lambda: d.worker(worker_name="w1"),
                        lambda: d.worker(worker_name="w2"))  # fmt: skip
    codes = [f"import time; time.sleep(0.05); print({i})" for i in range(60)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, api.url, codes)
        time.sleep(0.8)
        stopped = time.monotonic()
        assert w1.stop() == 0 and time.monotonic() - stopped < 5
        response = pending.result()
    assert outputs(response) == [f"{i}\n" for i in range(60)]  # what w1 had not run went back
    assert status(api.url)["reclaimed"] == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, api.url, ["import time; time.sleep(0.2); print('x')"] * 8)
        time.sleep(0.3)
        assert api.stop() in (0, -15)
        assert outputs(pending.result()) == ["x\n"] * 8  # the API node answered what it had


def test_burst_worker_drains_the_queue_and_exits(deployment: Deployment) -> None:
    api = deployment.api()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, api.url, [f"print({i})" for i in range(30)])
        while status(api.url)["queue_depth"] < 30:
            time.sleep(0.05)
        done = subprocess.run(
            [sys.executable, "-m", "sandbox_service.cli", "worker", "--burst", "--slots", "1",
             "--worker-metrics-port", "0", "--uid-base", str(deployment.uid_base)],
            env=deployment.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert outputs(pending.result()) == [f"{i}\n" for i in range(30)]
    assert status(api.url)["queue_depth"] == 0 and status(api.url)["workers"] == []
