"""The Docker engine as the image tests use it: its CLI, containers they start and always
remove, and why they cannot run (the engine's own words) where they cannot.

Containers and networks are named ``sandbox-test-<pid>-...``, so a run removes only its own.
Ports are published on 127.0.0.1 only: every request goes to loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

IMAGE = os.environ.get("SANDBOX_TEST_IMAGE", "sandbox-service:dev")
# deploy/image.sh makes it from Debian's redis-server: compose's Redis image needs a registry.
REDIS_IMAGE = os.environ.get("SANDBOX_TEST_REDIS_IMAGE", "sandbox-redis:dev")
# `make test-image` sets it: there, an engine or image that is missing fails the step.
REQUIRED = os.environ.get("SANDBOX_TEST_IMAGE_REQUIRED") == "1"
PREFIX = f"sandbox-test-{os.getpid()}"
ROOT = Path(__file__).resolve().parents[2]


def docker_cli() -> str | None:
    return shutil.which("docker") or (
        "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else None
    )


def docker(*args: str, timeout_s: float = 60, check: bool = True) -> str:
    cli = docker_cli()
    assert cli is not None
    done = subprocess.run([cli, *args], capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout.strip()


def why_not() -> str | None:
    """None where the engine answers and both images exist; else why not, in its words."""
    cli = docker_cli()
    if cli is None:
        return "no docker client on PATH or at /usr/bin/docker (`make image` installs docker.io)"
    try:
        info = subprocess.run([cli, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=20)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    if info.returncode != 0:
        said = (info.stderr or info.stdout).strip().splitlines()
        return f"no Docker engine answers ({said[-1] if said else info.returncode}): `make image`"
    for image in (IMAGE, REDIS_IMAGE):
        found = subprocess.run([cli, "image", "inspect", image], capture_output=True, text=True,
                               timeout=20)  # fmt: skip
        if found.returncode != 0:
            return f"image {image} is not built ({found.stderr.strip()}): `make image`"
    return None


@dataclass
class Container:
    name: str

    def port(self, inner: int) -> int:
        """The loopback port Docker published ``inner`` on."""
        published = docker("port", self.name, f"{inner}/tcp").splitlines()[0]
        return int(published.rsplit(":", 1)[1])

    def url(self, inner: int = 8000) -> str:
        return f"http://127.0.0.1:{self.port(inner)}"

    def logs(self) -> str:
        done = subprocess.run([docker_cli() or "docker", "logs", self.name],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        return done.stdout + done.stderr

    def state(self) -> dict[str, object]:
        return dict(json.loads(docker("inspect", "--format", "{{json .State}}", self.name)))

    def terminate(self, grace_s: float) -> dict[str, object]:
        """SIGTERM, then the container's state once it exited by itself (or fail)."""
        docker("kill", "--signal", "TERM", self.name)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            state = self.state()
            if not state["Running"]:
                return state
            time.sleep(0.2)
        raise AssertionError(f"{self.name} still runs {grace_s} s after SIGTERM:\n{self.logs()}")


@dataclass
class Engine:
    """Starts containers and networks for one test and removes every one of them after."""

    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)

    def network(self, name: str) -> str:
        full = f"{PREFIX}-{name}"
        docker("network", "create", full)
        self.networks.append(full)
        return full

    def run(self, name: str, image: str, options: list[str], args: list[str]) -> Container:
        full = f"{PREFIX}-{name}"
        self.containers.append(full)
        docker("run", "--detach", "--name", full, *options, image, *args)
        return Container(full)

    def remove_all(self) -> None:
        for name in self.containers:
            docker("rm", "--force", "--volumes", name, check=False)
        for name in self.networks:
            docker("network", "rm", name, check=False)


def engine() -> Iterator[Engine]:
    made = Engine()
    try:
        yield made
    finally:
        made.remove_all()


def wait_until(check: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s: {what()}")


def ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
