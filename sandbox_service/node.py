"""The two processes of Redis mode: the API node's runtime and the worker node.

``sandbox-service api`` serves the same routes as the embedded service over a
``RedisRuntime`` (a Redis queue, no slots). ``sandbox-service worker`` runs a ``WorkerNode``:
slots, the same worker loop as the embedded service fed by the Redis queue, a heartbeat, and
``/metrics``, ``/healthz`` and ``/readyz`` on ``worker_metrics_port`` for Prometheus and the
orchestrator's probes. Both reconnect to Redis on their own; both stop gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from sandbox_service.executor.pool import SlotPool
from sandbox_service.metrics import CONTENT_TYPE, Metrics
from sandbox_service.models import StatusReport
from sandbox_service.probes import json_probe as _json
from sandbox_service.probes import serve_probes
from sandbox_service.queue.base import Queue
from sandbox_service.queue.redis import RedisJobSource, RedisQueue
from sandbox_service.runtime import limits
from sandbox_service.settings import Settings
from sandbox_service.worker import Worker, default_name

log = logging.getLogger(__name__)


class RedisRuntime:
    """``sandbox-service api``: the routes in front of a Redis queue; workers run the jobs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics(settings.max_tenant_labels)
        self.redis = RedisQueue(settings, self.metrics)
        self.queue: Queue = self.redis  # what the routes see: the Queue interface only
        self.started_at = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._rejecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.redis.start()
        # Cluster-wide jobs admitted and not answered (waiting + running), and the
        # requests this node is waiting on.
        self.metrics.watch(self.metrics.queue_depth, lambda: self.redis.cluster_depth)
        self.metrics.watch(self.metrics.in_flight, lambda: self.redis.in_flight)
        self.metrics.watch_tenants(self.redis.tenant_counts)

    def begin_shutdown(self) -> None:
        if self._deadline is not None:
            return
        self.redis.begin_shutdown()
        grace = self.settings.graceful_shutdown_s
        log.info("shutting down: no new work; %.0f s for work in flight", grace)
        self._deadline = asyncio.get_running_loop().call_later(grace, self._grace_over)

    def _grace_over(self) -> None:
        message = "the API node shut down before this request started; it did not run"
        self._rejecting = asyncio.create_task(self.redis.reject_undelivered(message))

    async def stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        await self.redis.close()

    async def ready(self) -> tuple[bool, str]:
        return await self.redis.ready()

    async def status(self) -> StatusReport:
        cluster = await self.redis.cluster()
        return StatusReport(
            mode="redis",
            queue_depth=max(0, cluster.depth - cluster.running),
            in_flight=cluster.running,
            workers=cluster.workers,
            isolation=cluster.isolation,
            executions=cluster.executions,
            reclaimed=cluster.reclaimed,
            limits={**limits(self.settings), "chunk_size": self.settings.chunk_size},
            uptime_s=round(time.monotonic() - self.started_at, 3),
        )


# ---------------------------------------------------------------- worker node


class WorkerNode:
    """``sandbox-service worker``: slots fed by the Redis queue."""

    def __init__(self, settings: Settings, burst: bool = False) -> None:
        self.settings = settings
        self.name = settings.worker_name or default_name()
        self.metrics = Metrics(settings.max_tenant_labels)
        self.pool = SlotPool(settings)
        self.source = RedisJobSource(settings, self.metrics, self.name, burst)
        self.worker = Worker(self.pool, self.source, settings, self.metrics, self.name)
        self.stopping = False

    def describe(self) -> dict[str, Any]:
        """What the heartbeat tells the API nodes about this worker."""
        return {
            "slots": len(self.pool.slots),
            "busy": self.worker.busy,
            "executions": self.worker.executions,
            "healthy_slots": self.pool.healthy(),
            "isolation": self.pool.isolation,
        }

    async def _healthz(self) -> tuple[int, str, bytes]:
        return _json(200, {"status": "ok"})

    async def _readyz(self) -> tuple[int, str, bytes]:
        why = "shutting down" if self.stopping else self.pool.not_ready()
        if why is None and not self.source.ready_to_work:
            why = f"Redis at {self.source.link.where} is unreachable"
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
            await self.pool.start()
            self.metrics.watch(self.metrics.queue_depth, lambda: self.source.cluster_depth)
            self.metrics.watch(self.metrics.in_flight, lambda: self.worker.busy)
            await self.source.start(self.describe)
            self.worker.start()
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
        log.info("worker %s stopping: finishing %d running jobs", self.name, self.worker.busy)
        self.source.stop_taking()
        await self.worker.stop(self.settings.graceful_shutdown_s)
        await self.source.close()
        log.info("worker %s stopped after %d executions", self.name, self.worker.executions)


def run_worker(settings: Settings, burst: bool = False) -> int:
    from sandbox_service.server import configure_logging

    configure_logging(settings.log_level)
    node = WorkerNode(settings, burst)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(node.run())
    return uvloop.run(node.run())
