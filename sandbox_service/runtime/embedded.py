"""The embedded runtime (``sandbox-service serve``): queue, slot loop and slots in one process."""

from __future__ import annotations

import asyncio
import logging
import time

from sandbox_service.executor.languages import toolchains
from sandbox_service.executor.pool import SlotPool
from sandbox_service.executor.slot import Slot
from sandbox_service.metrics import Metrics
from sandbox_service.models import SlotState, StatusReport, WorkerInfo
from sandbox_service.queue.base import node_name
from sandbox_service.queue.local import LocalQueue
from sandbox_service.runtime.base import limits
from sandbox_service.settings import Settings
from sandbox_service.slot_loop import SlotLoop

log = logging.getLogger(__name__)


def slot_state(slot: Slot, uid_layer: bool) -> SlotState:
    return SlotState(
        index=slot.index,
        pid=slot.pid,
        busy=slot.busy,
        executions=slot.executions,
        restarts=slot.restarts,
        uid=slot.cfg.uid if uid_layer else None,
        healthy=slot.healthy,
        canaries=slot.canaries,
        failures=slot.failures,
        last_error=slot.last_error,
    )


class EmbeddedRuntime:
    """``sandbox-service serve``: API, queue and slots in one process tree."""

    def __init__(self, settings: Settings, name: str | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics(settings.max_tenant_labels)
        self.pool = SlotPool(settings)
        self.queue = LocalQueue(settings, cannot_run=self.pool.broken, metrics=self.metrics)
        self.slot_loop = SlotLoop(
            self.pool, self.queue, settings, self.metrics, name or node_name()
        )
        self.started_at = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        # The toolchains are probed (once: /v1/status and the compile cache read the result)
        # while the zygotes start, rather than by the first status request or compile.
        await asyncio.gather(self.pool.start(), asyncio.to_thread(toolchains))
        await self.queue.start()
        self.metrics.watch(self.metrics.queue_depth, lambda: self.queue.counts()[0])
        self.metrics.watch(self.metrics.in_flight, lambda: self.queue.counts()[1])
        self.metrics.watch_tenants(self.queue.tenant_counts)
        self.slot_loop.start()

    def begin_shutdown(self) -> None:
        if self._deadline is not None:
            return
        self.queue.begin_shutdown()
        grace = self.settings.graceful_shutdown_s
        log.info("shutting down: no new work; %.0f s for queued and running work", grace)
        self._deadline = asyncio.get_running_loop().call_later(grace, self._grace_over)

    def _grace_over(self) -> None:
        rejected = self.queue.reject_waiting(
            "the service is shutting down and this request had not started; it did not run"
        )
        if rejected:
            log.warning("grace period over: %d queued requests answered 'rejected'", rejected)

    async def stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self.queue.begin_shutdown()
        await self.queue.close()  # what never started is answered 'rejected'
        await self.slot_loop.stop(grace_s=1.0)  # what is still running is answered 'killed'
        await self.pool.stop()

    async def ready(self) -> tuple[bool, str]:
        ok, why = await self.queue.ready()
        if not ok:
            return ok, why
        slots_down = self.pool.not_ready()
        return (False, slots_down) if slots_down else (True, "")

    async def status(self) -> StatusReport:
        waiting, running = await self.queue.depth()
        uid_layer = self.pool.isolation.get("uid") is True
        slots = [slot_state(s, uid_layer) for s in self.pool.slots]
        return StatusReport(
            mode="embedded",
            queue_depth=waiting,
            in_flight=running,
            workers=[
                WorkerInfo(
                    name=self.slot_loop.name,
                    slots=len(self.pool.slots),
                    busy=self.slot_loop.busy,
                    executions=self.slot_loop.executions,
                    healthy_slots=self.pool.healthy(),
                    cores=self.slot_loop.cores.count,
                    stragglers=self.slot_loop.cores.stragglers,
                )
            ],
            slots=slots,
            light_slots=[slot_state(s, uid_layer) for s in self.pool.light],
            isolation=self.pool.isolation,
            languages=await asyncio.to_thread(toolchains),
            zygote=self.pool.zygote,
            executions=dict(self.metrics.by_status),
            dropped=dict(self.metrics.dropped_by),
            limits=limits(self.settings),
            uptime_s=round(time.monotonic() - self.started_at, 3),
        )
