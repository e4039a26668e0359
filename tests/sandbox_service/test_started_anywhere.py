"""The service runs the same wherever it is started: any working directory (one that is
deleted after start included), ``HOME`` and ``TMPDIR`` set as the image sets them, root or not,
embedded or as a Redis worker node. Started from /tmp as root, every execution once failed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.service_process import ServiceProcess, start
from tests.sandbox_service.redis_helpers import RedisServer

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
IMAGE_ENV = {"HOME": "/tmp", "TMPDIR": "/tmp"}  # what deploy/Dockerfile sets
FAST: dict[str, Any] = {"slots": 1, "preload": "math", "warmup": ""}
PROGRAM = "import os\nopen('here.txt', 'w').write('x')\nprint(6 * 7, os.getcwd() != '')"


def check_executes(url: str) -> dict[str, bool | str]:
    """One execution answers ok / 42 (writing into its working directory on the way);
    returns the isolation the service reports."""
    with SandboxClient(url) as client:
        result = client.execute(PROGRAM)
        assert (result.status.value, result.stdout) == ("ok", "42 True\n"), result
        return client.status().isolation


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool | str]:
    """The isolation layers this host allows, as a service started from the repository has."""
    log = tmp_path_factory.mktemp("baseline") / "service.log"
    service = start(str(log), cwd=str(REPO), **FAST)
    try:
        return check_executes(service.url)
    finally:
        service.stop()


def _directory(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind in ("/", "/tmp"):
        yield kind
        return
    parent = {"/tmp/sub": "/tmp", "hidden": "/root", "deleted": "/tmp"}[kind]
    path = os.path.join(parent, f"sbx-cwd-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", ["/", "/tmp", "/tmp/sub", "hidden", "deleted"])
def test_embedded_service_executes_from_any_directory(
    kind: str, tmp_path: Path, baseline: dict[str, bool | str]
) -> None:
    if kind == "hidden" and not os.access("/root", os.W_OK):
        pytest.skip("needs a writable /root (the hidden-path case is run as root)")
    for cwd in _directory(kind, tmp_path):
        service = start(str(tmp_path / "service.log"), cwd=cwd, extra_env=IMAGE_ENV, **FAST)
        try:
            assert check_executes(service.url) == baseline
            if kind == "deleted":
                # The directory goes; a zygote started after that must not care.
                os.rmdir(cwd)
                with SandboxClient(service.url) as client:
                    before = client.status().slots[0]
                    assert before.pid is not None
                    os.kill(before.pid, signal.SIGKILL)
                    wait_for_new_zygote(client, before.pid)
                assert check_executes(service.url) == baseline
        finally:
            service.stop()
        assert "zygote restarted" not in service.log() or kind == "deleted"


def wait_for_new_zygote(client: SandboxClient, old_pid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        slot = client.status().slots[0]
        if slot.healthy and slot.pid not in (None, old_pid):
            return
        time.sleep(0.1)
    raise AssertionError("the zygote was not replaced")


def test_worker_node_executes_started_from_tmp(
    tmp_path: Path, redis_server: RedisServer, prefix: str, baseline: dict[str, bool | str]
) -> None:
    common = {"redis_url": redis_server.url, "redis_prefix": prefix, **FAST}
    api = start(str(tmp_path / "api.log"), command=("api",), cwd="/tmp", **common)
    try:
        worker = start(str(tmp_path / "worker.log"), command=("worker",),
                       port_setting="worker_metrics_port", cwd="/tmp", extra_env=IMAGE_ENV,
                       **common)  # fmt: skip
        try:
            assert check_executes(api.url) == baseline
        finally:
            worker.stop()
    finally:
        api.stop()


@pytest.fixture(scope="module")
def nobody_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Python the unprivileged user can run, with this package installed (this one may live
    under root's home, closed to other users)."""
    if not ROOT or shutil.which("setpriv") is None:
        pytest.skip("runs the service as nobody: needs root and setpriv")
    system = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if system is None or os.path.realpath(system).startswith("/root"):
        pytest.skip("no system Python that other users can run")
    venv = Path(f"/tmp/sbx-nobody-venv-{uuid.uuid4().hex[:8]}")
    try:
        subprocess.run([system, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(REPO)]
        subprocess.run(pip, check=True, cwd="/")
        yield str(venv / "bin/python")
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.parametrize("cwd", ["/", "/tmp"])
def test_unprivileged_service_executes_from_any_directory(
    cwd: str, tmp_path: Path, nobody_python: str
) -> None:
    work_root = Path(f"/tmp/sbx-nobody-work-{uuid.uuid4().hex[:8]}")
    work_root.mkdir()
    os.chown(work_root, 65534, 65534)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", nobody_python]
    log = Path(f"/tmp/sbx-nobody-{uuid.uuid4().hex[:8]}.log")
    try:
        service = start(str(log), python=as_nobody, cwd=cwd, extra_env=IMAGE_ENV,
                        work_root=str(work_root), uid_base=None, **FAST)  # fmt: skip
        try:
            isolation = check_executes(service.url)
        finally:
            service.stop()
        assert isolation["uid"] is not True and isolation["rlimits"] is True
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
        log.unlink(missing_ok=True)


# ------------------------------------------------------------- readiness proves execution

# A warm-up that leaves every child unable to print: the zygote starts, its canary fails.
BREAKS_PRINT = "import builtins; builtins.print = lambda *args, **kwargs: None"


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("broken") / "service.log"
    service = start(str(log), wait_for="/healthz", slots=2, preload="math",
                    warmup=BREAKS_PRINT)  # fmt: skip
    yield service
    service.stop()


def test_a_slot_that_cannot_execute_is_not_ready(broken: ServiceProcess) -> None:
    ready = httpx.get(f"{broken.url}/readyz")
    assert ready.status_code == 503
    reason = ready.json()["reason"]
    assert reason.startswith("no slot can execute: slot ")
    assert "canary answered ok with stdout ''" in reason
    report = httpx.get(f"{broken.url}/v1/status").json()
    for slot in report["slots"]:
        assert slot["healthy"] is False
        assert slot["failures"] >= 1
        assert "canary" in slot["last_error"]
    assert report["workers"][0]["healthy_slots"] == 0


def test_work_sent_to_a_node_that_cannot_execute_is_refused_with_the_reason(
    broken: ServiceProcess,
) -> None:
    answer = httpx.post(f"{broken.url}/v1/execute", json={"code": "print(1)"})
    assert answer.status_code == 503
    assert "no slot can execute" in answer.text


def test_a_failing_slot_backs_off_and_says_why_once(broken: ServiceProcess) -> None:
    """Retries keep coming, each later than the one before, and the log names the reason once
    per slot, not once per attempt."""
    deadline = time.monotonic() + 60
    failures = 0
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{broken.url}/metrics").text
        failures = sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in metrics.splitlines()
            if line.startswith('sandbox_slot_start_failures_total{kind="canary"}')
        )
        if failures >= 8:  # 2 at start, then 3 more per slot: 0.5 + 1 + 2 s of backoff
            break
        time.sleep(0.2)
    assert failures >= 8
    log = broken.log()
    assert log.count("cannot execute: canary answered") == 2  # at start, one per slot
    retries = [line for line in log.splitlines() if "retrying with backoff" in line]
    assert len(retries) == 2, retries  # the reason did not change: said once per slot
    restarts = httpx.get(f"{broken.url}/v1/status").json()["slots"][0]["restarts"]
    assert 3 <= restarts <= 6  # backing off, not spinning


def test_a_healthy_slot_reports_it(client: SandboxClient) -> None:
    report = client.status()
    assert all(s.healthy and s.failures == 0 and s.last_error is None for s in report.slots)
    assert report.workers[0].healthy_slots == len(report.slots)


def test_the_canary_runs_again_periodically(tmp_path: Path) -> None:
    """With a short interval, canaries keep running on an idle service, on the same zygote
    (not counted as restarts)."""
    service = start(str(tmp_path / "service.log"), canary_interval_s=0.2, **FAST)
    try:
        with SandboxClient(service.url) as client:
            before = client.status().slots[0]
            time.sleep(2)
            after = client.status().slots[0]
        assert after.canaries >= before.canaries + 3
        assert after.pid == before.pid and after.restarts == before.restarts and after.healthy
    finally:
        service.stop()
