"""The Redis API node's runtime (``sandbox-service api``): the routes in front of a Redis queue.

No slots here: worker nodes (``worker_node``) take the jobs from Redis and run them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sandbox_service.executor.languages import toolchains
from sandbox_service.metrics import Metrics
from sandbox_service.models import StatusReport
from sandbox_service.queue.base import Queue
from sandbox_service.queue.redis.producer import RedisQueue
from sandbox_service.runtime.base import limits
from sandbox_service.settings import Settings

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
        await asyncio.gather(self.redis.start(), asyncio.to_thread(toolchains))  # as embedded
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
            languages=await asyncio.to_thread(toolchains),
            executions=cluster.executions,
            reclaimed=cluster.reclaimed,
            limits={**limits(self.settings), "chunk_size": self.settings.chunk_size},
            uptime_s=round(time.monotonic() - self.started_at, 3),
        )
