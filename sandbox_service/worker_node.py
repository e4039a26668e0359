"""The worker node of Redis mode (``sandbox-service worker``) and its probe server.

A ``WorkerNode`` runs slots, the same slot loop as the embedded service fed by the Redis queue
(``queue.redis.consumer``), a heartbeat, and ``/metrics``, ``/healthz`` and ``/readyz`` on
``worker_metrics_port`` for Prometheus and the orchestrator's probes. It reconnects to Redis on
its own and stops gracefully on SIGTERM. The API node's side is ``runtime.redis``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from sandbox_service.descriptors import raise_fd_limit
from sandbox_service.executor.languages import toolchains
from sandbox_service.executor.pool import SlotPool
from sandbox_service.metrics import CONTENT_TYPE, Metrics
from sandbox_service.probe_server import json_probe as _json
from sandbox_service.probe_server import serve_probes
from sandbox_service.queue.base import node_name
from sandbox_service.queue.redis.consumer import RedisJobSource
from sandbox_service.settings import Settings
from sandbox_service.slot_loop import SlotLoop

log = logging.getLogger(__name__)


class WorkerNode:
    """``sandbox-service worker``: slots fed by the Redis queue."""

    def __init__(self, settings: Settings, burst: bool = False) -> None:
        self.settings = settings
        self.name = settings.worker_name or node_name()
        self.metrics = Metrics(settings.max_tenant_labels)
        self.pool = SlotPool(settings)
        self.source = RedisJobSource(settings, self.metrics, self.name, burst)
        self.slot_loop = SlotLoop(self.pool, self.source, settings, self.metrics, self.name)
        self.stopping = False

    def describe(self) -> dict[str, Any]:
        """What the heartbeat tells the API nodes about this worker."""
        return {
            "slots": len(self.pool.slots),
            "busy": self.slot_loop.busy,
            "executions": self.slot_loop.executions,
            "healthy_slots": self.pool.healthy(),
            "cores": self.slot_loop.cores.count,
            "stragglers": self.slot_loop.cores.stragglers,
            "isolation": self.pool.isolation,
        }

    async def _healthz(self) -> tuple[int, str, bytes]:
        return _json(200, {"status": "ok"})

    async def _readyz(self) -> tuple[int, str, bytes]:
        why = "shutting down" if self.stopping else self.pool.not_ready()
        if why is None and not self.source.ready_to_work:
            why = self.source.link.problem or f"Redis at {self.source.link.where}: not reached yet"
        if why is None:
            return _json(200, {"status": "ready"})
        return _json(503, {"status": "not ready", "reason": why})

    async def _metrics(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE, self.metrics.render()

    async def run(self) -> int:
        """Until SIGTERM/SIGINT (or, in burst mode, until the queue is empty)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        routes = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}
        probes = await serve_probes(self.settings.host, self.settings.worker_metrics_port, routes)
        try:
            await asyncio.gather(self.pool.start(), asyncio.to_thread(toolchains))  # as embedded
            self.metrics.watch(self.metrics.queue_depth, lambda: self.source.cluster_depth)
            self.metrics.watch(self.metrics.in_flight, lambda: self.slot_loop.busy)
            await self.source.start(self.describe)
            self.slot_loop.start()
            log.info("worker %s: %d slots", self.name, len(self.pool.slots))
            waits = [
                asyncio.create_task(stop.wait()),
                asyncio.create_task(self.source.finished.wait()),
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()
            await self.shutdown()
        finally:
            await self.pool.stop()
            probes.close()
        return 0

    async def shutdown(self) -> None:
        """Take no more jobs, let the running ones finish (up to the grace period), settle
        what is held (unstarted jobs go back on the queue), leave."""
        self.stopping = True
        log.info("worker %s stopping: finishing %d running jobs", self.name, self.slot_loop.busy)
        self.source.stop_taking()
        await self.slot_loop.stop(self.settings.graceful_shutdown_s)
        await self.source.close()
        log.info("worker %s stopped after %d executions", self.name, self.slot_loop.executions)


def run_worker(settings: Settings, burst: bool = False) -> int:
    raise_fd_limit()
    node = WorkerNode(settings, burst)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(node.run())
    return uvloop.run(node.run())
