"""The image under gVisor (runsc), as k8s/overlays/gvisor runs workers: the worker's security
context from k8s/base/worker.yaml, the overlay's required layers from
k8s/components/gvisor/worker-isolation.yaml, `--runtime runsc` (what `runtimeClassName:
gvisor` selects; deploy/runsc.sh registers it). The same checks as the other shapes, the
fallbacks for what gVisor lacks reported in /v1/status, the attacks whose layers are active
there, the service's credentials out of reach, and exec/s under runsc against runc, printed.

Where runsc cannot run here, the test fails (or skips outside `make test-image`) with the
engine's own words, which name the kernel feature; the other shapes run regardless.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sandbox_service.client import SandboxClient
from tests.image.engine import IMAGE, REQUIRED, ROOT, Container, Engine, docker, docker_cli
from tests.image.test_shapes import (
    SLOTS,
    Secret,
    check_api,
    check_isolation,
    k8s_container,
    k8s_options,
    stop_all,
    wait_ready,
)
from tests.security.attacks import FILES as FILE_ATTACKS
from tests.security.attacks import NETWORK, PROCESSES, Target

OVERLAY = ROOT / "k8s" / "components" / "gvisor" / "worker-isolation.yaml"
# What gVisor (20221219, ptrace platform) gives a worker: no mount layer (mount / MS_PRIVATE:
# EINVAL; no mount_setattr), no pid namespace of its own (one procfs for every mount).
GVISOR = {"rlimits": True, "seccomp": True, "uid": True, "net": True, "mount": False}
FALLBACKS = ("subreaper_note", "pidfd_note", "pid_note")
RATE_S = 8.0  # how long each runtime is measured
RATE_CLIENTS = 4


def why_no_runsc() -> str | None:
    """None where the engine runs a container with runsc; else why not, in its words."""
    runtimes = docker("info", "--format", "{{json .Runtimes}}", check=False)
    if "runsc" not in runtimes:
        return f"the engine has no runtime `runsc` (deploy/runsc.sh registers it): {runtimes}"
    tried = subprocess.run([docker_cli() or "docker", "run", "--rm", "--runtime", "runsc",
                            "--entrypoint", "python3", IMAGE, "-c", "print('up')"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    if tried.stdout.strip() != "up":
        return f"runsc cannot run a container here: {(tried.stderr or tried.stdout).strip()}"
    return None


@pytest.fixture(scope="module")
def runsc() -> None:
    why = why_no_runsc()
    if why is None:
        return
    if REQUIRED:
        pytest.fail(why)
    pytest.skip(why)


def worker_options(secret_dir: Path, runtime: str) -> list[str]:
    """docker run options for a worker as the gVisor overlay runs it (the overlay's
    environment after the base's: the last -e wins), under ``runtime``."""
    pod, c = k8s_container("worker.yaml")
    options = k8s_options(pod, c, secret_dir)
    [patch] = yaml.safe_load(OVERLAY.read_text())["spec"]["template"]["spec"]["containers"]
    options += [arg for e in patch["env"] for arg in ("-e", f"{e['name']}={e['value']}")]
    return [*options, "--runtime", runtime, "-p", "127.0.0.1::8000"]


def start_worker(engine: Engine, name: str, secret_dir: Path, runtime: str) -> Container:
    node = engine.run(name, IMAGE, worker_options(secret_dir, runtime), ["serve", "--slots", SLOTS])
    return node


def attacks_held(url: str) -> list[str]:
    """The network, file and process attacks whose layers are active: what got through."""
    escaped = []
    with SandboxClient(url) as client:
        status = client.status()
        active = {k for k, v in status.isolation.items() if v is True}
        target = Target(api_port=8000, service_pid=1, zygote_pid=status.slots[0].pid or 0)
        for attack in NETWORK + FILE_ATTACKS + PROCESSES:
            if not set(attack.needs) <= active:
                continue
            result = attack.run(client, target)
            if not attack.contained(result):
                escaped.append(f"{attack.name}: {result.status.value} {result.stdout[-200:]!r}")
    return escaped


def read_secret(url: str) -> dict[str, Any]:
    code = "print(open('/etc/sandbox/redis/password').read())"
    return dict(httpx.post(f"{url}/v1/execute", json={"code": code}, timeout=60).json())


def test_worker_under_gvisor(runsc: None, docker_engine: Engine, secret: Secret) -> None:
    node = start_worker(docker_engine, "gvisor", secret.root_only, "runsc")
    url = node.url()
    wait_ready(node, url)
    check_api(url)
    check_isolation(url, GVISOR)
    isolation = httpx.get(f"{url}/v1/status", timeout=10).json()["isolation"]
    assert all(isolation.get(note) for note in FALLBACKS), isolation
    print("\nunder runsc:", {k: v for k, v in isolation.items() if not k.endswith("_note")})
    for name, note in sorted(isolation.items()):
        if name.endswith("_note"):
            print(f"  {name}: {note}")
    assert attacks_held(url) == []
    stolen = read_secret(url)
    assert "PermissionError" in stolen["stderr"], stolen
    pod, _ = k8s_container("worker.yaml")
    stop_all([(node, pod["terminationGracePeriodSeconds"])])


def test_a_readable_secret_stops_gvisor_workers(
    runsc: None, docker_engine: Engine, secret: Secret
) -> None:
    """The Secret world-readable (podman ignores defaultMode), no mount layer to hide it: the
    worker stays up, not ready, saying which file and why."""
    node = start_worker(docker_engine, "gvisor-readable", secret.readable, "runsc")
    url = node.url()

    def said() -> str:
        try:
            answer = httpx.get(f"{url}/readyz", timeout=5)
        except httpx.HTTPError:
            return ""
        return str(answer.json().get("reason", "")) if answer.status_code == 503 else ""

    deadline = time.monotonic() + 120
    while "credentials" not in said() and time.monotonic() < deadline:
        time.sleep(1)
    reason = said()
    assert "/etc/sandbox/redis" in reason and "mode 0444" in reason, (reason, node.logs()[-2000:])


def rate(url: str) -> float:
    """Executions per second of `print(1)` from RATE_CLIENTS clients over RATE_S seconds."""
    done = [0] * RATE_CLIENTS
    stop = time.monotonic() + RATE_S

    def client(i: int) -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                r = http.post(f"{url}/v1/execute", json={"code": "print(1)"}).json()
                assert r["status"] == "ok", r
                done[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(RATE_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / RATE_S


@pytest.fixture
def both(docker_engine: Engine, secret: Secret) -> Iterator[dict[str, str]]:
    urls = {}
    for runtime in ("runc", "runsc"):
        node = start_worker(docker_engine, f"rate-{runtime}", secret.root_only, runtime)
        urls[runtime] = node.url()
        wait_ready(node, urls[runtime])
    yield urls


def test_exec_rate_runsc_against_runc(runsc: None, both: dict[str, str]) -> None:
    """Printed, not asserted: the same worker, the same `print(1)`, one runtime after the
    other on this machine."""
    figures = {runtime: rate(url) for runtime, url in both.items()}
    print(f"\nexec/s, {SLOTS} slots, {RATE_CLIENTS} clients, {RATE_S:.0f} s each: "
          + ", ".join(f"{k} {v:.0f}" for k, v in figures.items())
          + f" (runsc/runc {figures['runsc'] / figures['runc']:.2f})")  # fmt: skip
    assert all(v > 0 for v in figures.values())
