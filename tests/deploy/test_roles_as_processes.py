"""The manifests' own command lines and environment, run as plain processes on loopback.

What the cluster would run, less the container: a Redis, the worker Deployment's container
command and environment, the API Deployment's; the probes the manifests declare answer,
an execution goes through, and both roles stop on SIGTERM well within their
terminationGracePeriodSeconds. Runs where the Redis-backed commands exist and a redis-server
binary is on PATH. Ports and the slot count are made small and local; everything else is
taken from the rendered manifests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sandbox_service import cli
from tests.deploy.manifests import (
    DEPLOY,
    K8S,
    Doc,
    container,
    kustomize_command,
    named,
    of_kind,
    render,
)

pytestmark = [
    pytest.mark.skipif(
        "worker" not in cli.COMMANDS, reason="the Redis-backed commands are not merged yet"
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH"),
    pytest.mark.skipif(kustomize_command() is None, reason="no kubectl or kustomize on PATH"),
]

OVERLAY = "overlays/production"
# Local stand-ins for what the cluster gives: loopback, free ports, one quick slot, and uids
# no other test run on this machine uses.
LOCAL = {"SANDBOX_HOST": "127.0.0.1", "SANDBOX_PRELOAD": "math", "SANDBOX_WARMUP": "",
         "SANDBOX_UID_BASE": "64900"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


PASSWORD = "manifest-test-pw"  # what the Secret sandbox-redis-auth holds, here


@pytest.fixture
def redis_address(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", PASSWORD],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: _pong(port), 10, "redis-server")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _pong(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(f"AUTH {PASSWORD}\r\nPING\r\n".encode())
        return b"+PONG" in s.recv(32)


def environment(docs: tuple[Doc, ...], c: Doc) -> dict[str, str]:
    """The container's environment as the cluster gives it: literal values, ConfigMap keys
    from the rendered ConfigMaps, the Secret's key as PASSWORD."""
    maps = {m["metadata"]["name"]: m["data"] for m in of_kind(docs, "ConfigMap")}
    env = {}
    for e in c["env"]:
        source = e.get("valueFrom", {})
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[e["name"]] = maps[ref["name"]][ref["key"]]
        elif "secretKeyRef" in source:
            env[e["name"]] = PASSWORD
        else:
            env[e["name"]] = e["value"]
    return env


def start_role(docs: tuple[Doc, ...], c: Doc, overrides: dict[str, str], log: Path
               ) -> subprocess.Popen[bytes]:  # fmt: skip
    """The container's args as they stand (no $(VAR) to expand: the manifests keep settings in
    the environment), one slot instead of four."""
    env = {**environment(docs, c), **LOCAL, **overrides}
    assert not [a for a in c["args"] if "$(" in a], c["args"]
    argv = [sys.executable, "-m", "sandbox_service.cli", *c["args"]]
    if "--slots" in argv:
        argv[argv.index("--slots") + 1] = "1"
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def probe(c: Doc, kind: str, port: int, env: dict[str, str]) -> bool:
    """A probe as the kubelet runs it: an HTTP GET, or the exec'd command (the image's health
    check, deploy/healthcheck.py here) in the container's environment."""
    spec = c[kind]
    if "httpGet" in spec:
        url = f"http://127.0.0.1:{port}{spec['httpGet']['path']}"
        return httpx.get(url, timeout=5).status_code == 200
    python, script, *args = spec["exec"]["command"]
    assert (python, Path(script).name) == ("python3", "healthcheck.py")
    argv = [sys.executable, str(DEPLOY / "healthcheck.py"), *args]
    return subprocess.run(argv, env={**os.environ, **env}, timeout=30).returncode == 0


def stop(proc: subprocess.Popen[bytes], grace_s: int) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        # uvicorn re-raises the signal it caught once it has shut down cleanly.
        assert proc.wait(grace_s) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - started


@dataclass
class Roles:
    """An API node and a worker started from the rendered manifests, sharing one Redis."""

    docs: tuple[Doc, ...]
    api_c: Doc
    worker_c: Doc
    api_port: int
    worker_port: int
    api_env: dict[str, str]
    worker_env: dict[str, str]
    api: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]

    def execute(self, code: str, timeout_s: float = 10) -> dict:
        r = httpx.post(f"http://127.0.0.1:{self.api_port}/v1/execute",
                       json={"code": code, "timeout_s": timeout_s}, timeout=60)  # fmt: skip
        return dict(r.json())

    def scrape(self, role: str) -> dict[str, list[Sample]]:
        """The samples /metrics of this role exports, by series name."""
        port = self.api_port if role == "api" else self.worker_port
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        samples: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(text):
            # A labelled family with no value yet (refusals before any) is exported all the
            # same: its HELP and TYPE lines are there.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
            for suffix in suffixes.get(family.type, ("",)):
                samples.setdefault(family.name + suffix, [])
            for s in family.samples:
                samples.setdefault(s.name, []).append(s)
        return samples


@pytest.fixture
def roles(redis_address: str, tmp_path: Path) -> Iterator[Roles]:
    docs = render(OVERLAY)
    worker_c, api_c = container(docs, "sandbox-worker"), container(docs, "sandbox-api")
    worker_port, api_port = free_port(), free_port()
    # Stand-ins for what the cluster gives: the Secret's file, where the manifests mount it, is
    # here instead; the Redis URL names this test's Redis (no cluster DNS), the rest of the
    # URL as the ConfigMap has it.
    assert environment(docs, worker_c)["SANDBOX_REDIS_PASSWORD_FILE"]
    (tmp_path / "password").write_text(PASSWORD + "\n")
    url = environment(docs, worker_c)["SANDBOX_REDIS_URL"]
    assert url == environment(docs, api_c)["SANDBOX_REDIS_URL"]
    local = {"SANDBOX_REDIS_PASSWORD_FILE": str(tmp_path / "password"),
             "SANDBOX_REDIS_URL": re.sub(r"//[^/]+/", f"//{redis_address}/", url)}  # fmt: skip
    worker_env = {"SANDBOX_WORKER_METRICS_PORT": str(worker_port), **local}
    api_env = {"SANDBOX_PORT": str(api_port), **local}
    worker = start_role(docs, worker_c, worker_env, tmp_path / "worker.log")
    api = start_role(docs, api_c, api_env, tmp_path / "api.log")
    started = Roles(docs, api_c, worker_c, api_port, worker_port,
                    {**environment(docs, api_c), **LOCAL, **api_env},
                    {**environment(docs, worker_c), **LOCAL, **worker_env}, api, worker)  # fmt: skip
    try:
        for c, port, env in ((worker_c, worker_port, started.worker_env),
                             (api_c, api_port, started.api_env)):  # fmt: skip
            wait_until(lambda c=c, port=port, env=env: probe(c, "startupProbe", port, env),
                       60, f"{c['name']} to start")  # fmt: skip
            wait_until(lambda c=c, port=port, env=env: probe(c, "readinessProbe", port, env),
                       60, f"{c['name']} to be ready")  # fmt: skip
            assert probe(c, "livenessProbe", port, env)
        yield started
    finally:
        for proc in (worker, api):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in tmp_path.glob("*.log"):
            print(log.name, log.read_text()[-3000:], sep="\n")


def test_worker_and_api_run_as_the_manifests_say(roles: Roles, redis_address: str) -> None:
    redis = pytest.importorskip("redis", reason="the redis extra is not installed")
    docs = roles.docs
    r = roles.execute("print(6 * 7)")
    assert (r["status"], r["stdout"]) == ("ok", "42\n"), r
    status = httpx.get(f"http://127.0.0.1:{roles.api_port}/v1/status", timeout=5).json()
    assert status["workers"], status
    # What KEDA's trigger reads: the stream exists, and settled chunks leave it.
    [trigger] = named(docs, "ScaledObject", "sandbox-worker")["spec"]["triggers"]
    stream = trigger["metadata"]["stream"]
    db = redis.Redis.from_url(f"redis://:{PASSWORD}@{redis_address}/0")
    groups = [g["name"].decode() for g in db.xinfo_groups(stream)]
    assert groups == ["workers"] and db.xlen(stream) == 0
    for deployment, proc in (("sandbox-worker", roles.worker), ("sandbox-api", roles.api)):
        spec = named(docs, "Deployment", deployment)["spec"]["template"]["spec"]
        took = stop(proc, spec["terminationGracePeriodSeconds"])
        assert took < spec["terminationGracePeriodSeconds"]


# ---------------------------------------------------------------- the dashboard's PromQL

DASHBOARD = K8S / "components" / "monitoring" / "dashboards" / "sandbox-service.json"
# A series selector of the dashboard: name{matchers}.
SELECTOR = re.compile(r"(sandbox_[a-z0-9_]+)\{([^}]*)\}")
AGGREGATE = re.compile(r"\b(sum|max)\((sandbox_[a-z0-9_]+)\{([^}]*)\}\)")


def _role(matchers: str) -> str:
    """The role a selector reads: its `container` matcher (Prometheus Operator's label for
    the pod's container, which the manifests name `api` and `worker`)."""
    found = re.search(r'container="([a-z]+)"', matchers)
    assert found, f"a selector without a role counts API and worker series together: {matchers}"
    return found.group(1)


def _instant(expr: str, scrapes: dict[str, dict[str, list[Sample]]]) -> float:
    """The value of a gauge panel's expression now: each sum()/max() of a selector computed
    over the samples its role exports (one pod per role here), then the arithmetic."""

    def value(m: re.Match[str]) -> str:
        agg, name, matchers = m.groups()
        values = [s.value for s in scrapes[_role(matchers)][name]]
        return repr(sum(values) if agg == "sum" else max(values))

    arithmetic = AGGREGATE.sub(value, expr).replace("clamp_min(", "max(")
    assert re.fullmatch(r"[0-9.()\s,+\-max]*", arithmetic), arithmetic
    return float(eval(arithmetic))  # digits, operators, max() (checked)


def _panel(dashboard: dict, title: str) -> dict[str, str]:
    [panel] = [p for p in dashboard["panels"] if p["title"].startswith(title)]
    return {t["legendFormat"]: t["expr"] for t in panel["targets"]}


def test_dashboard_reads_what_each_role_exports(roles: Roles) -> None:
    """Every series the dashboard plots comes from the role that exports it, counted once;
    the queue panel's waiting and running are right while one job runs and one waits."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert {roles.api_c["name"], roles.worker_c["name"]} == {"api", "worker"}
    assert roles.execute("print(1)")["status"] == "ok"
    scrapes = {"api": roles.scrape("api"), "worker": roles.scrape("worker")}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for expr in exprs:
        for name, matchers in SELECTOR.findall(expr):
            assert name in scrapes[_role(matchers)], (name, _role(matchers))
    # Executions counted once: the role the panel reads saw the one execution once.
    [per_second] = _panel(dashboard, "Executions per second").values()
    [(name, matchers)] = SELECTOR.findall(per_second)
    ok = [s for s in scrapes[_role(matchers)][name] if s.labels["status"] == "ok"]
    assert [s.value for s in ok] == [1.0]

    # One slot: a sleeping job runs, a second one waits behind it.
    queue = _panel(dashboard, "Queue: waiting and running")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(roles.execute, "import time; time.sleep(30)", 3)
        wait_until(lambda: roles.scrape("worker")["sandbox_slots_busy"][0].value == 1, 30,
                   "the first job to run")  # fmt: skip
        second = pool.submit(roles.execute, "print(2)")
        wait_until(lambda: roles.scrape("api")["sandbox_queue_depth"][0].value == 2, 30,
                   "the second job to be queued")  # fmt: skip
        scrapes = {"api": roles.scrape("api"), "worker": roles.scrape("worker")}
        if scrapes["worker"]["sandbox_slots_busy"][0].value == 1:  # the first still runs
            assert _instant(queue["running"], scrapes) == 1
            assert _instant(queue["waiting"], scrapes) == 1
        assert (first.result()["status"], second.result()["status"]) == ("timeout", "ok")
