"""`SANDBOX_EXECUTOR_BACKEND=docker` on the real engine: the service on this host, each slot's
zygote in a container of the built image; the same contract as the image's own shapes, and
after SIGTERM the service has exited and no slot container is left."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from sandbox_service.service_process import start
from tests.image.engine import IMAGE, REQUIRED, docker
from tests.image.test_shapes import START_S, check_api, layers

# deploy/README.md ("Docker executor backend"): each slot a container with every capability
# dropped but the per-slot uid's, no network but loopback; no SYS_ADMIN, so no mount layer.
PROMISED = {"rlimits": True, "seccomp": True, "uid": True, "net": True, "mount": False}


def slot_containers() -> set[str]:
    names = docker("ps", "--all", "--format", "{{.Names}}", "--filter", "name=sandbox-")
    return {n for n in names.split() if "-slot" in n and not n.startswith("sandbox-test-")}


def test_serve_with_slots_in_containers(tmp_path: Path) -> None:
    before = slot_containers()
    service = start(str(tmp_path / "service.log"), ready_timeout_s=START_S,
                     executor_backend="docker", docker_image=IMAGE, slots=2, uid_base=None)  # fmt: skip
    try:
        assert len(slot_containers() - before) >= 2, slot_containers()
        check_api(service.url)
        report = layers(service.url)
        assert report == PROMISED, report
        status = httpx.get(f"{service.url}/v1/status", timeout=10).json()
        assert status["isolation"]["container"] is True
    finally:
        # SIGTERM: the service stops its slots, and so their containers, before it exits.
        assert service.stop(60) in (0, -signal.SIGTERM), service.log()
    assert slot_containers() - before == set(), service.log()


def test_slot_containers_under_runsc(tmp_path: Path) -> None:
    """`--docker-runtime runsc`: each slot container in gVisor, with the fallbacks for what
    it lacks (tests/image/test_gvisor.py) reported; skipped where the engine has no runsc."""
    from tests.image.test_gvisor import FALLBACKS, why_no_runsc

    why = why_no_runsc()
    if why is not None:
        pytest.fail(why) if REQUIRED else pytest.skip(why)
    service = start(str(tmp_path / "service.log"), ready_timeout_s=START_S,
                    executor_backend="docker", docker_image=IMAGE, docker_runtime="runsc",
                    slots=1, uid_base=None, light_zygote=False)  # fmt: skip
    try:
        one = httpx.post(f"{service.url}/v1/execute", json={"code": "print(6 * 7)"}, timeout=60)
        assert one.json()["stdout"] == "42\n", one.text
        isolation = httpx.get(f"{service.url}/v1/status", timeout=10).json()["isolation"]
        assert isolation["uid"] is True and isolation["seccomp"] is True, isolation
        assert all(isolation.get(note) for note in FALLBACKS), isolation
    finally:
        assert service.stop(60) in (0, -signal.SIGTERM), service.log()
