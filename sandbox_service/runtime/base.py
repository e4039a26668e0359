"""What every runtime offers the routes: the ``Runtime`` interface and the published limits.

A runtime owns the queue the routes submit to and whatever executes the jobs, and knows how
to report on them and shut them down: ``runtime.embedded`` (queue and slots in-process) and
``runtime.redis`` (a Redis queue, slots on worker nodes).
"""

from __future__ import annotations

from typing import Protocol

from sandbox_service.metrics import Metrics
from sandbox_service.models import StatusReport
from sandbox_service.queue.base import Queue
from sandbox_service.settings import Settings


def limits(settings: Settings) -> dict[str, float | int]:
    """The policy maxima a client needs to know (batch size, timeouts) to size its requests."""
    return {
        "max_batch": settings.max_batch,
        "max_timeout_s": settings.max_timeout_s,
        "max_memory_mb": settings.max_memory_mb,
        "max_code_chars": settings.max_code_chars,
        "max_stdin_chars": settings.max_stdin_chars,
        "max_files_bytes": settings.max_files_bytes,
        "max_output_bytes": settings.max_output_bytes,
        "max_queue_depth": settings.max_queue_depth,
        "max_queue_wait_s": settings.max_queue_wait_s,
    }


class Runtime(Protocol):
    # Read-only here, so that a runtime may hold a narrower kind (LocalQueue, say).
    @property
    def settings(self) -> Settings: ...

    @property
    def queue(self) -> Queue: ...

    @property
    def metrics(self) -> Metrics: ...

    async def start(self) -> None: ...

    def begin_shutdown(self) -> None:
        """SIGTERM: take no new work; answer what is queued within the grace period."""
        ...

    async def stop(self) -> None: ...

    async def status(self) -> StatusReport: ...

    async def ready(self) -> tuple[bool, str]: ...
