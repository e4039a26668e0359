"""Start an embedded service as a child process and wait until it is ready.

For programs that need a sandbox and were not given a URL (the trainer, the load generator,
tests): ``with launch(slots=2) as service: ... service.url ...``. The service is a real
``sandbox-service serve`` process on a free loopback port, stopped with SIGTERM on exit.
The nodes of Redis mode start the same way (``command=("api",)``), and ``RedisServer`` gives
them a throwaway Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandbox_service.executor import isolation as iso


class LaunchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceProcess:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: str
    settings: dict[str, Any] = field(default_factory=dict)  # as started, defaults included

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _env(
    settings: dict[str, Any], port: int, extra_env: dict[str, str] | None, port_setting: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    env.update(extra_env or {})
    for name, value in settings.items():
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        env[f"SANDBOX_{name.upper()}"] = text
    env["SANDBOX_HOST"] = "127.0.0.1"
    env[f"SANDBOX_{port_setting.upper()}"] = str(port)
    return env


def start(
    log_path: str,
    ready_timeout_s: float = 120.0,
    extra_env: dict[str, str] | None = None,
    command: Sequence[str] = ("serve",),
    port_setting: str = "port",
    python: Sequence[str] = (sys.executable,),
    port: int | None = None,
    cwd: str | None = None,
    wait_for: str = "/readyz",
    die_with_starter: bool = False,
    **settings: Any,
) -> ServiceProcess:
    """Start ``sandbox-service serve`` with ``settings`` (names of Settings fields).

    Another ``command`` (``("api",)``, ``("worker", "--burst")``) starts another kind of node;
    ``port_setting`` names the setting that holds the port its ``/readyz`` answers on (a
    worker node's is ``worker_metrics_port``). ``python`` is the interpreter, possibly behind
    a wrapper (``setpriv ... /other/python`` runs the service as another user). ``port``: a
    free one unless given (a node restarted in the place of one that died). ``cwd``: the
    directory it starts in. ``wait_for``: the probe that must answer 200 (``/healthz`` for a
    service expected never to become ready). ``die_with_starter``: the service gets SIGTERM
    when the thread that started it ends, however it ends (a trainer killed with SIGKILL
    leaves no service behind); only for a starter whose thread outlives the service."""
    port = port or free_port()
    # Slot uids unique to this service, so that parallel test runs never have to move to
    # another range (executor.uids). ``uid_base=None``: the service's own default.
    if settings.setdefault("uid_base", 100_000 + port * 64) is None:
        del settings["uid_base"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [*python, "-m", "sandbox_service.cli", *command],
            env=_env(settings, port, extra_env, port_setting),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=_dies_with(os.getpid()) if die_with_starter else None,
        )
    service = ServiceProcess(f"http://127.0.0.1:{port}", port, process, log_path, settings)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(f"service exited with {process.returncode}:\n{service.log()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{service.url}{wait_for}", timeout=2).status_code == 200:
                return service
        time.sleep(0.1)
    service.stop()
    raise LaunchError(f"service not ready after {ready_timeout_s} s:\n{service.log()[-3000:]}")


def _dies_with(starter: int) -> Callable[[], None]:
    def in_child() -> None:
        iso.die_with_parent(signal.SIGTERM)
        if os.getppid() != starter:  # the starter died before the line above
            os._exit(1)

    return in_child


@contextlib.contextmanager
def launch(log_path: str | None = None, **settings: Any) -> Iterator[ServiceProcess]:
    """Context manager around ``start``; the log goes to a temporary file unless given."""
    path = log_path or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"sandbox-service-{os.getpid()}-{free_port()}.log"
    )
    service = start(path, **settings)
    try:
        yield service
    finally:
        service.stop()


class RedisServer:
    """A throwaway ``redis-server`` on a free loopback port, without persistence, for Redis
    mode in tests and benchmarks; it can be stopped (SIGKILL, as a crash: its data is gone)
    and started again on the same port."""

    def __init__(self, directory: str, args: Sequence[str] = (), tls: bool = False) -> None:
        """``args``: more redis-server options (``--requirepass``, ``--user``, TLS files);
        ``tls``: the port is a ``--tls-port`` (the plain one is off) and the URL ``rediss://``."""
        self.directory = directory
        self.port = free_port()
        self.args = list(args)
        self.tls = tls
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 10.0) -> None:
        with open(os.path.join(self.directory, "redis.log"), "ab") as log:
            ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls else [
                "--port", str(self.port)]  # fmt: skip
            self.process = subprocess.Popen(
                ["redis-server", *ports, "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", self.directory, *self.args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise LaunchError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
