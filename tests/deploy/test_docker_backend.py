"""The Docker executor backend: container options (pure), the in-container bridge (a real
zygote behind it), the service side against a stand-in engine, and, where a Docker engine
answers, the real thing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import asdict, replace
from typing import Any

import pytest

from sandbox_service.executor import protocol
from sandbox_service.executor.docker_backend import (
    CAPABILITIES,
    STDERR,
    STDOUT,
    WORK_ROOT,
    DockerLauncher,
    container_options,
    container_report,
    demultiplex,
)
from sandbox_service.executor.pool import SlotPool, launcher, zygote_config
from sandbox_service.executor.protocol import (
    IsolationReport,
    Limits,
    RunSpec,
    RunStatus,
    StartReport,
    ZygoteConfig,
)
from sandbox_service.executor.slot import Slot, launch_local
from sandbox_service.settings import Settings

RUN = RunSpec(code="print(6 * 7)", limits=Limits(timeout_s=10, memory_mb=512))


def _settings(**overrides: Any) -> Settings:
    base = {"executor_backend": "docker", "slots": 1, "preload": "", "warmup": ""}
    return Settings(**{**base, **overrides})


def _options(**overrides: Any) -> dict[str, Any]:
    settings = _settings(**overrides)
    return container_options(settings, zygote_config(settings, 0), "inst", "sandbox-inst-slot0-0")


# ---------------------------------------------------------------- container options


def test_slot_container_is_walled_in() -> None:
    opts = _options()
    assert opts["network_mode"] == "none"
    assert opts["read_only"] is True
    assert opts["cap_drop"] == ["ALL"] and set(opts["cap_add"]) == set(CAPABILITIES)
    assert "SYS_ADMIN" not in opts["cap_add"] and "privileged" not in opts
    assert "no-new-privileges:true" in opts["security_opt"]
    assert opts["tty"] is False and opts["stdin_open"] is True
    assert opts["ipc_mode"] == "private"
    assert set(opts["tmpfs"]) == {"/tmp"}
    assert "runtime" not in opts  # the engine's default unless asked


def test_limits_come_from_the_settings() -> None:
    opts = _options(docker_memory_mb=2048, docker_pids_limit=128, docker_cpus=1.5, tmpfs_mb=64,
                    docker_runtime="runsc", docker_image="registry.example/sandbox:1")  # fmt: skip
    assert opts["mem_limit"] == opts["memswap_limit"] == "2048m"
    assert opts["pids_limit"] == 128
    assert opts["nano_cpus"] == 1_500_000_000
    assert "size=64m" in opts["tmpfs"]["/tmp"]
    assert opts["runtime"] == "runsc"
    assert opts["image"] == "registry.example/sandbox:1"
    assert opts["command"][1] == "runsc"


def test_the_zygote_gets_its_config_and_none_of_the_service_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVICE_SECRET_TOKEN", "hunter2")
    opts = _options()
    assert "hunter2" not in json.dumps(opts)
    assert set(opts["environment"]) == {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE"}
    assert opts["entrypoint"][-1] == "sandbox_service.executor.docker_backend"
    cfg = ZygoteConfig(**json.loads(opts["command"][0]))
    assert cfg.work_root == WORK_ROOT and cfg.work_root.startswith("/tmp/")
    assert cfg.uid == Settings().uid_base  # root in its container, whoever runs the service
    assert opts["labels"]["sandbox-service.slot"] == "0"


def test_docker_sdk_accepts_the_options() -> None:
    """docker-py turns the options into an API request without an engine: every keyword is
    one it knows, and the host config it builds says what we asked for."""
    containers = pytest.importorskip("docker.models.containers")
    args = containers._create_container_args({**_options(docker_runtime="runsc"),
                                              "version": "1.44"})  # fmt: skip
    host = args["host_config"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["PidsLimit"] == Settings().docker_pids_limit and host["Init"] is True
    assert host["Memory"] == host["MemorySwap"] == Settings().docker_memory_mb * 2**20
    assert host["Runtime"] == "runsc"
    assert args["entrypoint"][:2] == ["python", "-m"]


def test_pool_picks_the_backend_from_the_settings() -> None:
    assert launcher(Settings(slots=1)) is launch_local
    assert isinstance(launcher(_settings()), DockerLauncher)
    pool = SlotPool(_settings(slots=2))
    assert all(isinstance(s._launch, DockerLauncher) for s in pool.slots)


def test_container_report_adds_what_the_container_gives() -> None:
    layers = {"net": False, "uid": True, "seccomp": True, "rlimits": True}
    zygote = IsolationReport(layers, {"net": "EPERM"})
    report = container_report(zygote, "runsc", ["lo"])
    assert report.active("container") and "runsc" in report.notes["container"]
    assert report.active("net") and "loopback only" in report.notes["net"]
    assert report.active("uid") and not zygote.active("net")  # the input is not changed
    assert not container_report(zygote, "", ["lo", "eth0"]).active("net")


def test_demultiplex_splits_stdout_from_stderr() -> None:
    def frame(stream: int, data: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    async def scenario() -> tuple[bytes, list[bytes]]:
        raw, out, errs = asyncio.StreamReader(), asyncio.StreamReader(), list[bytes]()
        raw.feed_data(frame(STDOUT, b"he") + frame(STDERR, b"warn\n") + frame(STDOUT, b"llo"))
        raw.feed_data(frame(STDOUT, b"!")[:5])  # cut mid-header: end of stream
        raw.feed_eof()
        await demultiplex(raw, out, errs.append)
        out.feed_eof()
        return await out.read(), errs

    assert asyncio.run(scenario()) == (b"hello", [b"warn\n"])


# ---------------------------------------------------------------- the in-container bridge


def _plain_config(**changes: Any) -> ZygoteConfig:
    """Slot 0's config from the default settings, with no uid of its own."""
    return replace(zygote_config(Settings(slots=1), 0), uid=None, gid=None, **changes)


def _bridge(cfg: ZygoteConfig, runtime: str = "runc") -> subprocess.Popen[bytes]:
    module = "sandbox_service.executor.docker_backend"
    config = json.dumps(asdict(cfg))
    return subprocess.Popen([sys.executable, "-m", module, config, runtime],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip


def _read_frame(stream: Any) -> dict[str, Any]:
    size = int.from_bytes(stream.read(4), "big")
    message: dict[str, Any] = json.loads(stream.read(size))
    for name, length in protocol.payload_sizes(message):
        message[name] = protocol.decode_payload(name, stream.read(length))
    return message


def test_bridge_speaks_frames_for_a_real_zygote(tmp_path: Any) -> None:
    """What runs as the container's command, run here as a plain process."""
    cfg = _plain_config(work_root=str(tmp_path), layers=["seccomp"])
    bridge = _bridge(cfg)
    assert bridge.stdin is not None and bridge.stdout is not None
    try:
        ready = _read_frame(bridge.stdout)
        assert ready["op"] == "ready"
        assert StartReport.from_frame(ready).isolation.active("container")
        bridge.stdin.write(protocol.encode(RUN.frame()))
        bridge.stdin.flush()
        result = _read_frame(bridge.stdout)
        assert (result["status"], result["stdout"]) == ("ok", "42\n")
        bridge.stdin.write(protocol.encode({"op": "exit"}))
        bridge.stdin.close()
        assert bridge.wait(timeout=30) == 0
    finally:
        bridge.kill()
        bridge.wait()


def test_bridge_exits_when_the_service_goes_away(tmp_path: Any) -> None:
    bridge = _bridge(_plain_config(work_root=str(tmp_path), layers=[]))
    assert bridge.stdin is not None and bridge.stdout is not None
    _read_frame(bridge.stdout)
    bridge.stdin.close()  # the attach stream closed: end of input
    assert bridge.wait(timeout=30) == 0


# ---------------------------------------------------------------- the service side


class _Engine:
    """Just enough of the docker SDK for DockerLauncher: `create` makes a container whose
    `start` runs the container's command as a local process, with Docker's attach stream
    (stdin in; stdout and stderr multiplexed out) on a socketpair."""

    def __init__(self) -> None:
        self.created: list[_Container] = []
        self.containers = self
        self.api = self

    def create(self, **options: Any) -> _Container:
        self.created.append(_Container(options))
        return self.created[-1]

    def list(self, **_: Any) -> list[_Container]:
        return []

    def attach_socket(self, container_id: str, params: dict[str, int]) -> socket.socket:
        assert params == {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        [container] = [c for c in self.created if c.id == container_id]
        return container.service_end


class _Container:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.id = options["name"]
        self.attrs: dict[str, Any] = {}
        self.removed = False
        self.engine_end, self.service_end = socket.socketpair()
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        argv = [sys.executable, *self.options["entrypoint"][1:], *self.options["command"]]
        env = {**os.environ, **self.options["environment"]}
        env["PATH"] = os.environ["PATH"]  # this machine's python, not the image's
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)  # fmt: skip
        self.attrs = {"State": {"Pid": self.proc.pid}}
        outputs = [threading.Thread(target=self._out, args=(s, n)) for s, n in
                   ((self.proc.stdout, STDOUT), (self.proc.stderr, STDERR))]  # fmt: skip
        for t in outputs:
            t.start()
        threading.Thread(target=self._in, daemon=True).start()
        threading.Thread(target=self._close_after, args=(outputs,), daemon=True).start()

    def _in(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            while chunk := self.engine_end.recv(65536):
                self.proc.stdin.write(chunk)
                self.proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def _out(self, stream: Any, kind: int) -> None:
        while chunk := os.read(stream.fileno(), 65536):
            with self._lock, contextlib.suppress(OSError, ValueError):
                self.engine_end.sendall(bytes([kind, 0, 0, 0]) + len(chunk).to_bytes(4, "big")
                                       + chunk)  # fmt: skip

    def _close_after(self, outputs: list[threading.Thread]) -> None:
        for t in outputs:
            t.join()
        self.engine_end.close()

    def reload(self) -> None:
        pass

    def wait(self, timeout: float) -> dict[str, int]:
        assert self.proc is not None
        return {"StatusCode": self.proc.wait(timeout)}

    def kill(self, signal: int = 9) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal)

    def remove(self, force: bool = False) -> None:
        self.removed = True


def test_slot_runs_through_a_container_and_cleans_up(tmp_path: Any) -> None:
    engine = _Engine()
    # The stand-in runs the "container" on this machine, as root: the zygote then drops to
    # and kills leftovers of its slot uid, so keep clear of the uids other test runs use.
    settings = _settings(work_root=str(tmp_path), uid_base=64800)

    async def scenario() -> None:
        launch = DockerLauncher(settings, client_factory=lambda: engine)
        slot = Slot(zygote_config(settings, 0), launch)
        ready = await slot.start()
        assert ready.isolation.active("container")
        assert slot.pid == engine.created[0].proc.pid  # type: ignore[union-attr]
        for _ in range(3):
            result = await slot.execute(RUN)
            assert (result.status, result.stdout) == (RunStatus.ok, "42\n")
        await slot.stop()
        assert slot.proc is not None and slot.proc.returncode == 0
        # A killed container is reaped and removed too, and a restart makes a new one, which
        # runs the canary before it counts as healthy.
        await slot.recover()
        assert len(engine.created) == 2 and slot.healthy
        await slot.kill()
        assert slot.proc.returncode is not None

    asyncio.run(asyncio.wait_for(scenario(), 120))
    assert all(c.removed for c in engine.created)
    names = [c.options["name"] for c in engine.created]
    assert len(set(names)) == 2


# ---------------------------------------------------------------- with a real engine


def _engine_or_skip() -> Any:
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers here ({type(exc).__name__}): the docker "
                    "backend's end-to-end test needs one")  # fmt: skip
    image = os.environ.get("SANDBOX_TEST_DOCKER_IMAGE", "sandbox-service:dev")
    try:
        client.images.get(image)
    except Exception:
        pytest.skip(f"image {image} is not built: `make image` (or docker build -f "
                    f"deploy/Dockerfile -t {image} .)")  # fmt: skip
    return image


def test_executions_in_real_slot_containers() -> None:
    image = _engine_or_skip()
    settings = _settings(docker_image=image, preload="math",
                         docker_runtime=os.environ.get("SANDBOX_TEST_DOCKER_RUNTIME", ""))  # fmt: skip

    async def scenario() -> None:
        pool = SlotPool(settings)
        await pool.start()
        try:
            assert pool.isolation["container"] is True
            assert pool.isolation["net"] is True and pool.isolation["uid"] is True
            # The interfaces from /proc/net/dev: if_nameindex() needs a socket seccomp refuses.
            code = ("import os; print(os.getuid(), [line.split(':')[0].strip() for line in "
                    "open('/proc/net/dev').readlines()[2:]])")  # fmt: skip
            result = await pool.slots[0].execute(replace(RUN, code=code))
            assert result.stdout == f"{settings.uid_base} ['lo']\n", result.stderr
        finally:
            await pool.stop()

    asyncio.run(asyncio.wait_for(scenario(), 300))
