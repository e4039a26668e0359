"""A slot: the service's handle on one zygote process, which it starts, talks to and restarts.

One execution at a time per slot. A zygote that dies or stops answering is killed and started
again; the execution it held raises ``SlotCrashed`` so the caller can decide what to do with
it (the worker retries it once elsewhere).
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
from dataclasses import asdict
from typing import Any, Protocol

import sandbox_service
from sandbox_service.executor import protocol
from sandbox_service.executor.zygote import ZygoteConfig

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take seconds
WATCHDOG_GRACE_S = 15.0  # beyond a run's own timeout before we stop trusting the zygote
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)


class SlotCrashed(Exception):
    """The zygote died or stopped answering during an execution."""


class SlotStartError(Exception):
    """A zygote could not be started."""


def _zygote_env() -> dict[str, str]:
    """The zygote's whole environment: nothing of the service's, so no secret reaches it."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(sandbox_service.__file__)))
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": package_parent,
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
            env=_zygote_env(),
            cwd="/",
        )
    finally:
        child.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent)
    return proc, reader, writer


class Slot:
    def __init__(self, cfg: ZygoteConfig, launch: Launcher = launch_local) -> None:
        self.cfg = cfg
        self.index = cfg.slot
        self._launch = launch
        self.proc: ZygoteProcess | None = None
        self.ready: dict[str, Any] = {}
        self.busy = False
        self.executions = 0
        self.restarts = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._ready = False  # the zygote answered "ready" and has not died since

    @property
    def alive(self) -> bool:
        return (
            self._ready
            and self._writer is not None
            and self.proc is not None
            and self.proc.returncode is None
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive and self.proc is not None else None

    async def start(self) -> dict[str, Any]:
        """Start the zygote and wait for its ready report (isolation layers, memory)."""
        self.proc, self._reader, self._writer = await self._launch(self.cfg)
        try:
            msg = await asyncio.wait_for(protocol.read_message(self._reader), START_TIMEOUT_S)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as exc:
            await self.kill()
            raise SlotStartError(f"slot {self.index}: zygote did not start ({exc!r})") from exc
        if msg.get("op") != "ready":
            await self.kill()
            raise SlotStartError(f"slot {self.index}: unexpected first message {msg!r}")
        self.ready = msg
        self._ready = True
        log.debug("slot %d ready: pid %s, %s", self.index, msg.get("pid"), msg.get("isolation"))
        return msg

    async def execute(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one request on the zygote; SlotCrashed if it dies or hangs meanwhile."""
        if not self.alive or self._writer is None or self._reader is None:
            raise SlotCrashed(f"slot {self.index} is not running")
        self.busy = True
        try:
            self._writer.write(protocol.encode({"op": "run", **request}))
            await self._writer.drain()
            limit = float(request["timeout_s"]) + WATCHDOG_GRACE_S
            result = await asyncio.wait_for(protocol.read_message(self._reader), limit)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as exc:
            await self.kill()
            raise SlotCrashed(f"slot {self.index}: zygote lost during execution ({exc!r})") from exc
        finally:
            self.busy = False
        self.executions += 1
        if result.pop("recycle", False):
            # It could not clean up after this run and exits on its own: never reuse it.
            await self.kill()
        return result

    async def wait_exit(self) -> None:
        """Return once the current zygote process has exited (at once if there is none)."""
        if self.proc is not None:
            await self.proc.wait()

    async def ensure_running(self) -> bool:
        """Restart the zygote if it is not running; concurrent callers share one restart.
        True if it had to be restarted."""
        if self.alive:
            return False
        if self._restarting is None or self._restarting.done():
            self._restarting = asyncio.create_task(self.restart(), name=f"restart-{self.index}")
        await asyncio.shield(self._restarting)
        return True

    async def restart(self) -> None:
        """Kill and start again, backing off when starts keep failing."""
        await self.kill()
        for attempt, delay in enumerate(RESTART_BACKOFF_S):
            await asyncio.sleep(delay)
            try:
                self.restarts += 1
                await self.start()
                return
            except SlotStartError as exc:
                log.warning("slot %d: restart %d failed: %s", self.index, attempt + 1, exc)
        raise SlotStartError(f"slot {self.index}: could not restart the zygote")

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
        self._ready = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
