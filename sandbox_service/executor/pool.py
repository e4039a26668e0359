"""The slots of one node: started together, checked against the required isolation, proven
with the canary, stopped.

Which layers are active is what the zygotes found at start-up, reported as is; a layer the
settings require that turns out to be unavailable is a start-up error, never a silent downgrade.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from sandbox_service.executor import uids
from sandbox_service.executor.imports import imports_only_stdlib, stdlib_only
from sandbox_service.executor.protocol import IsolationReport, ZygoteConfig
from sandbox_service.executor.slot import Launcher, Slot, SlotStartError, launch_local
from sandbox_service.settings import ISOLATION_LAYERS, Settings

log = logging.getLogger(__name__)

# What a zygote tries, each where the host allows it (rlimits always hold).
OPTIONAL_LAYERS = tuple(layer for layer in ISOLATION_LAYERS if layer != "rlimits")


class IsolationUnavailable(RuntimeError):
    """A required isolation layer is not available on this host."""


class PreloadFailed(RuntimeError):
    """A module of the preload list (or the warm-up) failed in the zygote."""


def zygote_config(
    settings: Settings, index: int, uid_base: int | None = None, light: bool = False
) -> ZygoteConfig:
    """Zygote ``index``'s config; ``uid_base``: the range claimed, if not the settings' own;
    ``light``: only the standard-library part of the preloads, and no warm-up."""
    # A slot container's zygote runs as root in its container, whoever runs the service.
    root = os.geteuid() == 0 or settings.executor_backend == "docker"
    uid = (uid_base if uid_base is not None else settings.uid_base) + index if root else None
    return ZygoteConfig(
        slot=index,
        uid=uid,
        gid=uid,
        layers=[layer for layer in OPTIONAL_LAYERS if layer not in settings.disable_isolation],
        preload=stdlib_only(settings.preload) if light else list(settings.preload),
        warmup="" if light else settings.warmup,
        work_root=settings.work_root,
        hide_paths=list(settings.hide_paths),
        tmpfs_mb=settings.tmpfs_mb,
        max_processes=settings.max_processes,
        max_open_files=settings.max_open_files,
        max_file_mb=settings.max_file_mb,
        max_output_bytes=settings.max_output_bytes,
        starved_extension=settings.starved_extension,
    )


def launcher(settings: Settings) -> Launcher:
    """How zygotes are started: local child processes, or containers (executor_backend)."""
    if settings.executor_backend == "docker":
        from sandbox_service.executor.docker_backend import DockerLauncher

        return DockerLauncher(settings)
    return launch_local


def wants_light(settings: Settings) -> bool:
    """Whether each slot gets a light zygote beside its full one: asked for, something to
    leave out of it, and zygotes that are local processes (not a container each)."""
    return (
        settings.light_zygote
        and stdlib_only(settings.preload) != list(settings.preload)
        and settings.executor_backend != "docker"
    )


class SlotPool:
    """``slots``: one full zygote per slot; ``light``: slot i's light zygote at index i (or
    none), with the uids after the full ones'. A slot runs one execution at a time on either."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        launch = launcher(settings)
        n = settings.slots
        self.slots = [Slot(zygote_config(settings, i), launch) for i in range(n)]
        self.light = [
            Slot(zygote_config(settings, n + i, light=True), launch)
            for i in range(n if wants_light(settings) else 0)
        ]
        self.isolation: dict[str, bool | str] = {}  # as /v1/status shows it
        self.zygote: dict[str, Any] = {}
        self.uids: uids.UidClaim | None = None

    def _claim_uids(self) -> None:
        """Claim this host's slot uids before any zygote starts (``executor.uids``); a
        default ``uid_base`` that another service holds moves to the next free range."""
        if self.slots[0].cfg.uid is None or self.settings.executor_backend == "docker":
            return  # no uid of our own here, or each zygote in a container of its own
        movable = "uid_base" not in self.settings.model_fields_set
        self.uids = uids.claim(self.settings.uid_base, len(self.zygotes), movable)
        if self.uids.base != self.settings.uid_base:
            n = len(self.slots)
            for i, slot in enumerate(self.zygotes):
                slot.cfg = zygote_config(self.settings, i, self.uids.base, light=i >= n)

    @property
    def zygotes(self) -> list[Slot]:
        return self.slots + self.light

    def zygote_for(self, index: int, code: str, language: str = "python") -> Slot:
        """Which of slot ``index``'s zygotes runs ``code``: the light one for a program that
        imports only the standard library, or that execs another language's command (its
        fork copies less), while it is healthy; else the full one."""
        light = language != "python" or imports_only_stdlib(code)
        if self.light and self.light[index].healthy and light:
            return self.light[index]
        return self.slots[index]

    async def start(self) -> None:
        self._claim_uids()
        outcomes = await asyncio.gather(*(s.start() for s in self.zygotes), return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            await self.stop()
            raise SlotStartError("; ".join(str(e) for e in errors))
        first = self.slots[0].report
        assert first is not None  # started
        report: IsolationReport = first.isolation
        self.isolation = report.published()
        self.zygote = {
            "rss_mb": first.rss_mb,
            "address_space_mb": first.address_space_mb,
            "huge_pages_mb": first.huge_pages_mb,
            "preload_failed": first.preload_failed,
        }
        failed = first.preload_failed
        if failed:
            # A module that cannot be imported means a broken environment (or an interpreter
            # the mount layer hid): refuse to start rather than serve executions that all pay
            # for the import or fail at it.
            await self.stop()
            why = "; ".join(failed)
            raise PreloadFailed(f"preload failed: {why} (install it, or drop it from --preload)")
        missing = [layer for layer in self.settings.require_isolation if not report.active(layer)]
        if missing:
            await self.stop()
            why = "; ".join(f"{m}: {report.note(m)}" for m in missing)
            raise IsolationUnavailable(f"required isolation unavailable: {why}")
        # Before the node says it is ready, every slot runs the canary through the whole
        # confinement. A slot that fails is not a start-up error (the worker keeps retrying it
        # with backoff, /readyz says why): the host may be at fault, not the settings.
        proofs = await asyncio.gather(*(s.prove() for s in self.zygotes))
        for slot, failed_canary in zip(self.zygotes, proofs, strict=True):
            if failed_canary is not None:
                log.error("slot %d cannot execute: %s", slot.index, failed_canary)
        active = [k for k in report.layers if report.active(k)]
        inactive = {k: report.note(k, "off") for k in OPTIONAL_LAYERS if not report.active(k)}
        light = " (and a light zygote each)" if self.light else ""
        log.info("%d slots up%s; isolation active: %s", len(self.slots), light, ", ".join(active))
        for layer, note in inactive.items():
            log.warning("isolation layer %s inactive: %s", layer, note)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.zygotes), return_exceptions=True)
        if self.uids is not None:
            self.uids.release()  # the zygotes of these uids are gone

    def healthy(self) -> int:
        """Slots that can execute now: running, and their last canary passed."""
        return sum(1 for s in self.slots if s.healthy)

    def broken(self) -> str | None:
        """Why no slot can execute, when every one has failed its last start or canary (not
        merely restarting): work admitted now would only wait for its queue timeout."""
        if all(s.failures and not s.healthy for s in self.slots):
            return self.not_ready()
        return None

    def not_ready(self) -> str | None:
        """Why no slot can take work (each slot's last error), or None if one can."""
        if self.healthy():
            return None
        errors = [s.last_error for s in self.slots if s.last_error]
        if errors:
            return "no slot can execute: " + "; ".join(errors)
        return "no slot is running (starting or restarting)"
