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

from sandbox_service.executor import isolation as iso
from sandbox_service.executor import uids
from sandbox_service.executor.imports import imports_only_stdlib, stdlib_only
from sandbox_service.executor.protocol import IsolationReport, StartReport, ZygoteConfig
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
        python_path=list(settings.python_path),
        work_root=settings.work_root,
        hide_paths=list(settings.hide_paths),
        tmpfs_mb=settings.tmpfs_mb,
        max_processes=settings.max_processes,
        max_open_files=settings.max_open_files,
        max_file_mb=settings.max_file_mb,
        max_output_bytes=settings.max_output_bytes,
        secret_files=secret_files(settings),
        starved_extension=settings.starved_extension,
    )


def secret_files(settings: Settings) -> list[str]:
    """Every file the service reads a credential from: each setting named ``*_file`` (the API
    keys, the Redis password, its TLS key and certificates), which zygotes hide from
    executions or refuse to start beside (``startup.check_secrets_hidden``)."""
    named = (
        getattr(settings, name) for name in type(settings).model_fields if name.endswith("_file")
    )
    return sorted({path for path in named if isinstance(path, str) and path})


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

    def _first_report(self) -> StartReport | None:
        return next((s.report for s in self.slots if s.report is not None), None)

    @property
    def isolation(self) -> dict[str, bool | str]:
        """The layers as /v1/status shows them: what the first slot's zygote reported (none
        yet while no zygote has started)."""
        first = self._first_report()
        return first.isolation.published() if first is not None else {}

    @property
    def zygote(self) -> dict[str, Any]:
        """The first slot's zygote's memory and preloads, as /v1/status shows them."""
        first = self._first_report()
        if first is None:
            return {}
        return {
            "rss_mb": first.rss_mb,
            "address_space_mb": first.address_space_mb,
            "huge_pages_mb": first.huge_pages_mb,
            "preload_failed": first.preload_failed,
        }

    def _require_on_restart(self) -> None:
        """Every later start of a zygote fails (its slot retries) without the required layers."""
        for slot in self.zygotes:
            slot.required = tuple(self.settings.require_isolation)

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
        """Start every zygote. One that cannot start is not a start-up error (its slot keeps
        retrying, /readyz and /v1/status say why, in the zygote's own words): like a failed
        canary, the host may be at fault, not the settings. What the first zygote up reports
        is checked against the settings: a required layer missing, or a preload failing, is."""
        self._claim_uids()
        outcomes = await asyncio.gather(*(s.start() for s in self.zygotes), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, SlotStartError):
                log.error("%s", outcome)
            elif isinstance(outcome, BaseException):
                await self.stop()
                raise outcome
        started = [s for s in self.slots if s.report is not None and s.alive]
        if not started:
            log.error("no zygote started; each slot retries with backoff")
            self._require_on_restart()
            return
        first = started[0].report
        assert first is not None  # started
        report: IsolationReport = first.isolation
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
        self._require_on_restart()
        # Before the node says it is ready, every slot runs the canary through the whole
        # confinement. A slot that fails is not a start-up error (the worker keeps retrying it
        # with backoff, /readyz says why): the host may be at fault, not the settings.
        up = [s for s in self.zygotes if s.alive]
        proofs = await asyncio.gather(*(s.prove() for s in up))
        for slot, failed_canary in zip(up, proofs, strict=True):
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
        if any(s.sweeps for s in self.zygotes):
            iso.kill_adopted_orphans()  # the last sweep: whatever a zygote's exit left us
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
