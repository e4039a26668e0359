"""A slot: the service's handle on one zygote process, which it starts, proves, talks to and
restarts.

One execution at a time per slot. A zygote that dies or stops answering is killed; the
execution it held raises ``SlotCrashed`` so the caller can decide what to do with it (the
worker retries it once elsewhere). When to restart, and how long to wait while restarts keep
failing, is the worker's policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import sandbox_service
from sandbox_service.executor import isolation as iso
from sandbox_service.executor import memory, protocol
from sandbox_service.executor.protocol import (
    Limits,
    Outcome,
    RunSpec,
    RunStatus,
    StartReport,
    ZygoteConfig,
)

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take seconds
WATCHDOG_GRACE_S = 15.0  # beyond a run's own timeout before we stop trusting the zygote
CANARY_TIMEOUT_S = 30.0  # generous: a loaded machine, not a slow canary, must not fail it
CANARY_MEMORY_MB = 256
CGROUP_REMOVE_TRIES = 40


class SlotCrashed(Exception):
    """The zygote died or stopped answering during an execution."""


class SlotStartError(Exception):
    """A zygote could not be started."""


class CanaryFailed(SlotStartError):
    """A zygote started but could not run the canary program correctly."""


def _zygote_env(python_path: list[str]) -> dict[str, str]:
    """The zygote's whole environment: nothing of the service's, so no secret reaches it. Its
    import path: the service's package first (nothing shadows it), then ``python_path`` (both
    before site-packages, as PYTHONPATH always is)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(sandbox_service.__file__)))
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join([package_parent, *python_path]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


# The zygote starts in "/" and without the working directory on sys.path (-P, Python 3.11+;
# the zygote drops it itself on 3.10): where the service was started must not matter. Started
# from /tmp, the directory it would have prepended made /tmp "an interpreter path" that the
# private /tmp had to keep visible, so no slot could write its working directory; and a root
# zygote would import whatever module a user had planted there.
ZYGOTE_COMMAND = (
    sys.executable,
    *(("-P",) if sys.version_info >= (3, 11) else ()),
    "-m",
    "sandbox_service.executor.zygote",
)


class ZygoteProcess(Protocol):
    """What a slot needs of a started zygote: a local child process, or a container."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


# Starts a zygote for a config and connects to it: (process, frames from it, frames to it).
Launcher = Callable[
    [ZygoteConfig],
    Awaitable[tuple[ZygoteProcess, asyncio.StreamReader, asyncio.StreamWriter]],
]


async def launch_local(
    cfg: ZygoteConfig,
) -> tuple[ZygoteProcess, asyncio.StreamReader, asyncio.StreamWriter]:
    """The default launcher: the zygote as a child process, frames over a socketpair."""
    parent, child = socket.socketpair()
    try:
        proc = await asyncio.create_subprocess_exec(
            *ZYGOTE_COMMAND,
            json.dumps(asdict(cfg)),
            str(child.fileno()),
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=_zygote_env(cfg.python_path),
            cwd="/",
        )
    finally:
        child.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent)
    return proc, reader, writer


@dataclass(frozen=True)
class Canary:
    """A program every zygote must run correctly, through the whole confinement, before its
    slot takes work: it reads stdin, writes and reads back a file in its working directory
    and prints. A slot that starts but cannot do this is not counted as ready."""

    code: str = (
        "import sys\n"
        "data = sys.stdin.read()\n"
        "with open('canary.txt', 'w') as f:\n"
        "    f.write(data)\n"
        "print(open('canary.txt').read(), 6 * 7)\n"
    )
    stdin: str = "canary"
    expected: str = "canary 42\n"

    def request(self) -> RunSpec[str]:
        limits = Limits(timeout_s=CANARY_TIMEOUT_S, memory_mb=CANARY_MEMORY_MB)
        return RunSpec(code=self.code, stdin=self.stdin, limits=limits)

    def failure(self, result: Outcome[str]) -> str | None:
        """Why ``result`` is not the canary's right answer, or None."""
        if result.status is RunStatus.ok and result.stdout == self.expected:
            return None
        why = result.message or result.stderr[-300:] or "no message"
        return (f"canary answered {result.status.value} with stdout "
                f"{result.stdout[:80]!r}: {why}")  # fmt: skip


CANARY = Canary()


class Slot:
    """One zygote: started, proven with the canary, fed one execution at a time, restarted.

    ``healthy`` means the zygote is running and its last canary passed; only then does the
    worker give it jobs. ``failures`` counts consecutive failed starts and canaries (reset by
    a success), which the worker turns into a capped exponential backoff.
    """

    def __init__(self, cfg: ZygoteConfig, launch: Launcher = launch_local) -> None:
        self.cfg = cfg
        self.index = cfg.slot
        self._launch = launch
        self.proc: ZygoteProcess | None = None
        self.report: StartReport | None = None  # what the running zygote said at start
        self.busy = False
        self.executions = 0
        self.restarts = 0
        self.canaries = 0
        self.failures = 0
        self.last_error: str | None = None
        self.required: tuple[str, ...] = ()  # layers without which a start fails
        self.sweeps = False  # this service adopts the orphans of a zygote that dies
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._running = False  # the zygote answered "ready" and has not died since
        self._proven = asyncio.Event()  # ... and its canary passed since
        self._turn = asyncio.Lock()  # one frame exchange at a time: executions and canaries

    @property
    def alive(self) -> bool:
        return (
            self._running
            and self._writer is not None
            and self.proc is not None
            and self.proc.returncode is None
        )

    @property
    def reaps_orphans(self) -> bool:
        """Whether this service, as pid 1, must reap what the executions left (no zygote
        adopts their orphans: gVisor's ``subreaper`` note, and no pid namespace)."""
        if self.report is None or os.getpid() != 1:
            return False
        isolation = self.report.isolation
        return "subreaper" in isolation.notes and not isolation.active("pid")

    @property
    def healthy(self) -> bool:
        return self.alive and self._proven.is_set()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive and self.proc is not None else None

    async def wait_healthy(self) -> None:
        while not self.healthy:
            await self._proven.wait()
            if not self.alive:  # died between proving itself and now
                self._proven.clear()

    async def start(self) -> StartReport:
        """Start the zygote and wait for its ready report (isolation layers, memory); a
        SlotStartError with the zygote's own reason if it cannot start (also ``last_error``)."""
        try:
            return await self._start()
        except SlotStartError as exc:
            self._failed(str(exc))
            raise

    async def _start(self) -> StartReport:
        self.proc, self._reader, self._writer = await self._launch(self.cfg)
        try:
            msg = await asyncio.wait_for(protocol.read_message(self._reader), START_TIMEOUT_S)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as exc:
            why = await self._exit_reason()
            await self.kill()
            why = why or repr(exc)
            raise SlotStartError(f"slot {self.index}: zygote did not start: {why}") from exc
        if msg.get("op") == "failed":
            await self.kill()
            raise SlotStartError(f"slot {self.index}: zygote cannot start: {msg.get('why')}")
        if msg.get("op") != "ready":
            await self.kill()
            raise SlotStartError(f"slot {self.index}: unexpected first message {msg!r}")
        report = StartReport.from_frame(msg)
        missing = [layer for layer in self.required if not report.isolation.active(layer)]
        if missing:
            await self.kill()
            why = "; ".join(f"{m}: {report.isolation.note(m)}" for m in missing)
            raise SlotStartError(f"slot {self.index}: required isolation unavailable: {why}")
        self.report = report
        if not report.isolation.active("pid") and self._launch is launch_local:
            self._adopt_orphans()  # a container's (docker backend) stay in the container
        self._running = True
        log.debug("slot %d ready: pid %s, %s", self.index, self.report.pid, self.report.isolation)
        return self.report

    def _adopt_orphans(self) -> None:
        """Without a pid namespace, what a zygote was running when it died would be re-parented
        to init and run on: as a subreaper this service adopts it, and ``kill`` kills it."""
        try:
            iso.become_subreaper()
        except OSError as exc:  # gVisor allows it only pid 1 (which adopts them anyway)
            log.warning("slot %d: the orphans of a dead zygote stay running: %s", self.index, exc)
            return
        self.sweeps = True

    async def _exit_reason(self) -> str | None:
        """How the zygote ended before its first frame (its exit status or signal), if it did
        within a moment: a death no frame could say (killed, or the interpreter itself)."""
        if self.proc is None:
            return None
        try:
            code = await asyncio.wait_for(self.proc.wait(), 2.0)
        except asyncio.TimeoutError:
            return None
        if code < 0:
            return f"killed by signal {signal.strsignal(-code) or -code} before its ready report"
        return f"exited with status {code} before its ready report (its stderr says why)"

    async def prove(self) -> str | None:
        """Run the canary; None if it passed (the slot is healthy), else why not (the zygote
        is killed: a slot that cannot run the canary must not run anyone's code)."""
        self.canaries += 1
        try:
            why = CANARY.failure(await self._exchange(CANARY.request()))
        except SlotCrashed as exc:
            why = str(exc)
        if why is None:
            self.failures = 0
            self.last_error = None
            self._proven.set()
            return None
        self._failed(f"slot {self.index}: {why}")
        await self.kill()
        return why

    async def recover(self) -> None:
        """Kill, start again and prove; SlotStartError (counted in ``failures``) if either
        the start or the canary fails."""
        await self.kill()
        self.restarts += 1
        await self.start()
        why = await self.prove()
        if why is not None:
            raise CanaryFailed(f"slot {self.index}: {why}")

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.last_error = why

    async def execute(self, spec: RunSpec[str]) -> Outcome[str]:
        """Run one execution on the zygote; SlotCrashed if it dies or hangs meanwhile, or if
        the zygote itself failed at it (a fault of ours, so the worker may retry it)."""
        result = await self._exchange(spec)
        self.executions += 1
        if self.reaps_orphans:
            iso.reap_adopted_zombies()
        if result.recycle and result.status is RunStatus.internal_error:
            raise SlotCrashed(f"slot {self.index}: {result.message}")
        return result

    async def _exchange(self, spec: RunSpec[str]) -> Outcome[str]:
        """Send one run frame, read its result (``recycle``: the zygote is now gone)."""
        async with self._turn:
            if not self.alive or self._writer is None or self._reader is None:
                raise SlotCrashed(f"slot {self.index} is not running")
            self.busy = True
            try:
                self._writer.write(protocol.encode(spec.frame()))
                await self._writer.drain()
                stretch = 1 + self.cfg.starved_extension
                limit = spec.limits.timeout_s * stretch + WATCHDOG_GRACE_S
                message = await asyncio.wait_for(protocol.read_message(self._reader), limit)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as exc:
                await self.kill()
                raise SlotCrashed(
                    f"slot {self.index}: zygote lost during execution ({exc!r})"
                ) from exc
            finally:
                self.busy = False
            result: Outcome[str] = Outcome.from_frame(message)
            if result.recycle:
                # It could not clean up after this run and exits on its own: never reuse it.
                await self.kill()
            return result

    def interrupt(self) -> bool:
        """Kill the execution running now and keep the zygote warm: SIGKILL to its child's
        process group (each execution leads its own), which the zygote reaps and answers like
        any killed run. False where no such child is found (a zygote behind a wrapper, no
        ``/proc/PID/task/PID/children``) or it cannot be signalled: then only ``kill`` stops
        the run."""
        pid = self.proc.pid if self.proc is not None else None
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(c) for c in f.read().split()]
            leaders = [c for c in children if os.getpgid(c) == c != os.getpgrp()]
            for child in leaders:
                os.killpg(child, signal.SIGKILL)
        except (OSError, ValueError):
            return False
        return bool(leaders)

    async def wait_exit(self) -> None:
        """Return once the current zygote process has exited (at once if there is none)."""
        if self.proc is not None:
            await self.proc.wait()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Ask the zygote to exit; kill it if it does not (its child dies with it)."""
        if self._writer is not None and self.alive:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._writer.write(protocol.encode({"op": "exit"}))
                await self._writer.drain()
            if self.proc is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), grace_s)
        await self.kill()

    async def kill(self) -> None:
        self._running = False
        self._proven.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        if self.sweeps:
            iso.kill_adopted_orphans()  # what a dead zygote was running came back to us
        await self._remove_cgroup()

    async def _remove_cgroup(self) -> None:
        """The zygote's memory cgroup goes with it (the next one of the slot makes it again);
        its last processes may take a moment to die after it."""
        path = self.report.cgroup if self.report is not None else None
        if path and not os.access(os.path.dirname(path), os.W_OK):
            return  # read-only here (a container's cgroup mount): the slot's next zygote reuses it
        for _ in range(CGROUP_REMOVE_TRIES):
            if not path or memory.remove_cgroup(path):
                return
            await asyncio.sleep(0.05)
