"""`SANDBOX_EXECUTOR_BACKEND=docker` on the real engine: the service on this host, each slot's
zygote in a container of the built image; the same contract as the image's own shapes, and
after SIGTERM no slot container and no process of the service is left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.image.engine import IMAGE, docker, ready, wait_until
from tests.image.test_shapes import START_S, check_api, layers

# deploy/README.md ("Docker executor backend"): each slot a container with every capability
# dropped but the per-slot uid's, no network but loopback; no SYS_ADMIN, so no mount layer.
PROMISED = {"rlimits": True, "seccomp": True, "uid": True, "net": True, "mount": False}


def slot_containers() -> set[str]:
    names = docker("ps", "--all", "--format", "{{.Names}}", "--filter", "name=sandbox-")
    return {n for n in names.split() if "-slot" in n and not n.startswith("sandbox-test-")}


def processes_in_session(sid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_with_slots_in_containers(tmp_path: Path) -> None:
    before = slot_containers()
    port = free_port()
    env = {**os.environ, "SANDBOX_EXECUTOR_BACKEND": "docker", "SANDBOX_DOCKER_IMAGE": IMAGE,
           "SANDBOX_PORT": str(port), "SANDBOX_SLOTS": "2"}  # fmt: skip
    log = tmp_path / "service.log"
    with open(log, "wb") as out:
        service = subprocess.Popen([sys.executable, "-m", "sandbox_service.cli", "serve"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: ready(url), START_S, log.read_text)
        assert len(slot_containers() - before) >= 2, slot_containers()
        check_api(url)
        report = layers(url)
        assert report == PROMISED, report
        assert httpx.get(f"{url}/v1/status", timeout=10).json()["isolation"]["container"] is True
        service.send_signal(signal.SIGTERM)
        assert service.wait(60) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(10)
    assert processes_in_session(service.pid) == []
    assert slot_containers() - before == set(), log.read_text()
