"""The Docker executor backend: each slot's zygote in a long-lived container of its own.

Selected by ``executor_backend = "docker"`` (``SANDBOX_EXECUTOR_BACKEND=docker``) on a host
with a Docker engine; needs the ``docker`` extra. A slot container has no network (network
mode ``none``: loopback only), a read-only root with a private tmpfs ``/tmp``, pids, memory
and CPU limits, every capability dropped but those the per-slot uid needs, no-new-privileges,
and optionally another OCI runtime (``runsc``: gVisor). Inside it the zygote confines each
execution as it does locally (uid drop, seccomp, rlimits); the container is the outer wall.

Wiring: the service creates the container with stdin open, attaches to its stdin, stdout and
stderr, then starts it (attaching first, so no output is missed). In the container,
:func:`main` (``python -m sandbox_service.executor.docker_backend CONFIG RUNTIME``) starts the
zygote on one end of a socketpair and copies bytes between it and stdin/stdout, so the slot
speaks the same length-prefixed frames as to a local zygote; it adds what the container
provides to the zygote's isolation report. Docker multiplexes the attached stdout and stderr
(an 8-byte header per chunk); :func:`demultiplex` takes them apart on the service side.

What this does not protect against: a kernel exploit under the default runtime (runc shares
the host kernel; use ``runsc``), and exhaustion of the Docker engine itself. Needs an engine
reached over a Unix socket or plain TCP: the attach stream is read as a raw socket, which TLS
and SSH transports do not give.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from sandbox_service.executor import protocol
from sandbox_service.executor.protocol import IsolationReport, StartReport, ZygoteConfig
from sandbox_service.executor.slot import SlotStartError
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)

SLOT_LABEL = "sandbox-service.slot"
INSTANCE_LABEL = "sandbox-service.instance"
# Root in the container only to drop each execution to the slot's uid, and to kill and clean
# up after that uid. No SYS_ADMIN: the container already has no network and its own /tmp.
CAPABILITIES = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]
WORK_ROOT = "/tmp/sandbox-service"  # inside the container's tmpfs, the only writable place
ENTRYPOINT = ["python", "-m", "sandbox_service.executor.docker_backend"]
ATTACH = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
STDOUT, STDERR = 1, 2
REAP_TIMEOUT_S = 30
CHUNK = 65536


# ---------------------------------------------------------------- the service side


def container_config(cfg: ZygoteConfig) -> ZygoteConfig:
    """The zygote's config as seen inside its container: working directories in its tmpfs."""
    return replace(cfg, work_root=WORK_ROOT)


def container_options(
    settings: Settings, cfg: ZygoteConfig, instance: str, name: str
) -> dict[str, Any]:
    """Keyword arguments of ``docker.client.containers.create`` for one slot's container."""
    options: dict[str, Any] = {
        "image": settings.docker_image,
        "entrypoint": ENTRYPOINT,
        "command": [json.dumps(asdict(container_config(cfg))), settings.docker_runtime],
        "name": name,
        "labels": {SLOT_LABEL: str(cfg.slot), INSTANCE_LABEL: instance},
        # The service's environment stays out: nothing of it reaches the zygote.
        "environment": {
            "PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        "user": "0:0",
        "working_dir": "/tmp",
        "stdin_open": True,
        "tty": False,  # raw frames; a TTY would rewrite bytes
        "init": True,  # a real PID 1 reaps and forwards signals
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={settings.tmpfs_mb}m,mode=1777"},
        "ipc_mode": "private",
        "cap_drop": ["ALL"],
        "cap_add": list(CAPABILITIES),
        "security_opt": ["no-new-privileges:true"],
        "mem_limit": f"{settings.docker_memory_mb}m",
        "memswap_limit": f"{settings.docker_memory_mb}m",  # equal: no swap
        "pids_limit": settings.docker_pids_limit,
        "nano_cpus": int(settings.docker_cpus * 1e9),
    }
    if settings.docker_runtime:
        options["runtime"] = settings.docker_runtime
    return options


async def demultiplex(
    raw: asyncio.StreamReader, stdout: asyncio.StreamReader, on_stderr: Callable[[bytes], None]
) -> None:
    """Split Docker's attach stream (tty off): each chunk is [stream, 0, 0, 0, size(4, big
    endian)] then ``size`` bytes. Stdout goes to ``stdout``; returns at end of stream."""
    while True:
        try:
            header = await raw.readexactly(8)
            payload = await raw.readexactly(int.from_bytes(header[4:8], "big"))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        if header[0] == STDOUT:
            stdout.feed_data(payload)
        elif header[0] == STDERR:
            on_stderr(payload)


class ContainerZygote:
    """A zygote in a container, as a slot sees a process: pid, returncode, wait, signal."""

    def __init__(self, container: Any, stdout: asyncio.StreamReader) -> None:
        self.container = container
        self.pid: int | None = None  # the host pid of the container's init, once started
        self.returncode: int | None = None
        self._stdout = stdout
        self._exited = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None

    def follow(self, raw: asyncio.StreamReader, slot: int) -> None:
        """Read the attach stream until it ends, then reap and remove the container."""

        def stderr(data: bytes) -> None:
            for line in data.decode(errors="replace").splitlines():
                log.warning("slot %d zygote: %s", slot, line)

        async def run() -> None:
            try:
                await demultiplex(raw, self._stdout, stderr)
            finally:
                self._stdout.feed_eof()
                self.returncode = await asyncio.to_thread(self._reap)
                self._exited.set()

        self._follower = asyncio.create_task(run(), name=f"slot-{slot}-container")

    def _reap(self) -> int:
        try:
            status = int(self.container.wait(timeout=REAP_TIMEOUT_S)["StatusCode"])
        except Exception as exc:  # engine unreachable or slow: the slot is gone either way
            log.warning("container %s: no exit status (%s); killing it", self.container.id, exc)
            status = -9
            with contextlib.suppress(Exception):
                self.container.kill()
        with contextlib.suppress(Exception):
            self.container.remove(force=True)
        return status

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the container; killing it ends the attach stream, and so ``wait``."""

        def kill() -> None:
            with contextlib.suppress(Exception):  # already gone
                self.container.kill(signal=int(sig))

        asyncio.get_running_loop().run_in_executor(None, kill)


def _docker_from_env() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SlotStartError(
            "executor_backend=docker needs the docker SDK: pip install 'sandbox-service[docker]'"
        ) from exc
    client = docker.from_env()
    base = str(client.api.base_url)
    if base.startswith(("https://", "http+docker://ssh")):
        raise SlotStartError(f"the docker backend needs a Unix-socket or plain-TCP engine: {base}")
    return client


class DockerLauncher:
    """Starts slots' zygotes in containers (a :data:`~sandbox_service.executor.slot.Launcher`)."""

    def __init__(
        self, settings: Settings, client_factory: Callable[[], Any] = _docker_from_env
    ) -> None:
        self.settings = settings
        self.instance = uuid.uuid4().hex[:12]
        self._client_factory = client_factory
        self._client: Any = None
        self._lock = threading.Lock()
        self._starts = itertools.count()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
                self._remove_exited()
            return self._client

    def _remove_exited(self) -> None:
        """Containers of a service that died are left exited: remove them."""
        filters = {"label": SLOT_LABEL, "status": "exited"}
        for container in self._client.containers.list(all=True, filters=filters):
            with contextlib.suppress(Exception):
                container.remove(force=True)

    def _create_and_attach(self, cfg: ZygoteConfig) -> tuple[Any, socket.socket]:
        client = self.client()
        name = f"sandbox-{self.instance}-slot{cfg.slot}-{next(self._starts)}"
        container = client.containers.create(
            **container_options(self.settings, cfg, self.instance, name)
        )
        try:
            attached = client.api.attach_socket(container.id, params=dict(ATTACH))
            raw = socket.socket(fileno=os.dup(attached.fileno()))
            attached.close()
        except Exception:
            with contextlib.suppress(Exception):
                container.remove(force=True)
            raise
        return container, raw

    async def __call__(
        self, cfg: ZygoteConfig
    ) -> tuple[ContainerZygote, asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            container, raw = await asyncio.to_thread(self._create_and_attach, cfg)
        except SlotStartError:
            raise
        except Exception as exc:  # the engine's errors, translated at the boundary
            raise SlotStartError(f"slot {cfg.slot}: cannot create its container: {exc}") from exc
        raw_reader, writer = await asyncio.open_connection(sock=raw)
        stdout = asyncio.StreamReader()
        zygote = ContainerZygote(container, stdout)
        zygote.follow(raw_reader, cfg.slot)
        try:
            await asyncio.to_thread(container.start)
            await asyncio.to_thread(container.reload)
        except Exception as exc:
            writer.close()
            await zygote.wait()
            raise SlotStartError(f"slot {cfg.slot}: cannot start its container: {exc}") from exc
        zygote.pid = container.attrs.get("State", {}).get("Pid") or None
        return zygote, stdout, writer


# ---------------------------------------------------------------- inside the container


def container_report(
    isolation: IsolationReport, runtime: str, interfaces: list[str]
) -> IsolationReport:
    """The zygote's isolation report plus what its container gives. A container whose only
    network interface is loopback isolates the network as the zygote's own namespace would."""
    layers = {**isolation.layers, "container": True}
    notes = dict(isolation.notes)
    notes["container"] = (
        f"docker container, runtime {runtime or 'default'}: no network, read-only root, "
        "pids and memory limits"
    )
    if not isolation.active("net") and interfaces == ["lo"]:
        layers["net"] = True
        notes["net"] = "container network none: loopback only"
    return IsolationReport(layers, notes)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _stdin_to(sock: socket.socket) -> None:
    while chunk := os.read(0, CHUNK):
        sock.sendall(chunk)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # the zygote reads end of input and exits


def main(argv: list[str]) -> int:
    """Run the zygote with ``argv[0]`` as its config; bridge its frames to stdin/stdout."""
    config, runtime = argv[0], (argv[1] if len(argv) > 1 else "")
    parent, child = socket.socketpair()
    zygote = subprocess.Popen(
        [sys.executable, "-m", "sandbox_service.executor.zygote", config, str(child.fileno())],
        pass_fds=[child.fileno()],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # stdout is the slot's frames; the zygote keeps stderr
    )
    child.close()
    ready = protocol.recv(parent)
    if ready is None:
        return zygote.wait() or 1
    if ready.get("op") == "ready":
        interfaces = [name for _, name in socket.if_nameindex()]
        report = StartReport.from_frame(ready)
        isolation = container_report(report.isolation, runtime, interfaces)
        ready = replace(report, isolation=isolation).frame()
    _write_all(1, protocol.encode(ready))
    threading.Thread(target=_stdin_to, args=(parent,), daemon=True).start()
    while chunk := parent.recv(CHUNK):
        _write_all(1, chunk)
    return zygote.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
