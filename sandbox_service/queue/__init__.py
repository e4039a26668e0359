"""Transports between API nodes and slots: in-process (embedded) and Redis (scale-out)."""

from sandbox_service.queue.base import (
    Job,
    JobSource,
    Queue,
    QueueFull,
    QueueUnavailable,
)
from sandbox_service.queue.local import LocalQueue

__all__ = ["Job", "JobSource", "LocalQueue", "Queue", "QueueFull", "QueueUnavailable"]
