"""The manifests' own command lines and environment, run as plain processes on loopback.

What the cluster would run, less the container: a Redis, the worker Deployment's container
command and environment, the API Deployment's; the probes the manifests declare answer,
an execution goes through, and both roles stop on SIGTERM well within their
terminationGracePeriodSeconds. Runs where the Redis-backed commands exist and a redis-server
binary is on PATH. Ports and the slot count are made small and local; everything else is
taken from the rendered manifests.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_service import cli
from tests.deploy.manifests import Doc, container, kustomize_command, named, render

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


def command_of(c: Doc, redis_address: str, env: dict[str, str]) -> tuple[list[str], dict]:
    """The container's args as Kubernetes expands them ($(VAR) from its env)."""
    values = {"REDIS_ADDRESS": redis_address, **env}
    args = []
    for arg in c["args"]:
        for name, value in values.items():
            arg = arg.replace(f"$({name})", value)
        args.append(arg)
    return [sys.executable, "-m", "sandbox_service.cli", *args], values


def start_role(c: Doc, redis_address: str, overrides: dict[str, str], log: Path
               ) -> subprocess.Popen[bytes]:  # fmt: skip
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(LOCAL, **overrides)
    argv, values = command_of(c, redis_address, env)
    if "--slots" in argv:
        argv[argv.index("--slots") + 1] = "1"
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env={**os.environ, **values}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def probe(c: Doc, kind: str, port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{c[kind]['httpGet']['path']}", timeout=5)


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


def test_worker_and_api_run_as_the_manifests_say(redis_address: str, tmp_path: Path) -> None:
    redis = pytest.importorskip("redis", reason="the redis extra is not installed")
    docs = render(OVERLAY)
    worker_c, api_c = container(docs, "sandbox-worker"), container(docs, "sandbox-api")
    worker_port, api_port = free_port(), free_port()
    # The Secret's file, where the manifests mount it, is here instead.
    assert {e["value"] for e in worker_c["env"] if e["name"] == "SANDBOX_REDIS_PASSWORD_FILE"}
    (tmp_path / "password").write_text(PASSWORD + "\n")
    secret = {"SANDBOX_REDIS_PASSWORD_FILE": str(tmp_path / "password")}
    worker = start_role(worker_c, redis_address, {"SANDBOX_WORKER_METRICS_PORT": str(worker_port),
                        **secret}, tmp_path / "worker.log")  # fmt: skip
    api = start_role(api_c, redis_address, {"SANDBOX_PORT": str(api_port), **secret},
                     tmp_path / "api.log")  # fmt: skip
    try:
        for c, port in ((worker_c, worker_port), (api_c, api_port)):
            wait_until(lambda c=c, port=port: probe(c, "startupProbe", port).status_code == 200,
                       60, f"{c['name']} to start")  # fmt: skip
            wait_until(lambda c=c, port=port: probe(c, "readinessProbe", port).status_code == 200,
                       60, f"{c['name']} to be ready")  # fmt: skip
            assert probe(c, "livenessProbe", port).status_code == 200
        r = httpx.post(f"http://127.0.0.1:{api_port}/v1/execute", json={"code": "print(6 * 7)"},
                       timeout=60)  # fmt: skip
        assert (r.json()["status"], r.json()["stdout"]) == ("ok", "42\n"), r.text
        status = httpx.get(f"http://127.0.0.1:{api_port}/v1/status", timeout=5).json()
        assert status["workers"], status
        # What KEDA's trigger reads: the stream exists, and settled chunks leave it.
        [trigger] = named(docs, "ScaledObject", "sandbox-worker")["spec"]["triggers"]
        stream = trigger["metadata"]["stream"]
        db = redis.Redis.from_url(f"redis://:{PASSWORD}@{redis_address}/0")
        groups = [g["name"].decode() for g in db.xinfo_groups(stream)]
        assert groups == ["workers"] and db.xlen(stream) == 0
        for deployment, proc in (("sandbox-worker", worker), ("sandbox-api", api)):
            spec = named(docs, "Deployment", deployment)["spec"]["template"]["spec"]
            took = stop(proc, spec["terminationGracePeriodSeconds"])
            assert took < spec["terminationGracePeriodSeconds"]
    finally:
        for proc in (worker, api):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in tmp_path.glob("*.log"):
            print(log.name, log.read_text()[-3000:], sep="\n")
