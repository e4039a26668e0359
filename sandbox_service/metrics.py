"""Prometheus metrics an autoscaler and an operator can use, in a registry per process.

Names are stable (dashboards and the Kubernetes autoscaler read them): queue depth, in-flight
jobs, executions by status, queue-wait and run-time histograms, slot restarts, reclaimed jobs
and refused requests.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sandbox_service.models import ExecuteResult

# Most executions take milliseconds; the long tail is bounded by the maximum timeout.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.executions = Counter(
            "sandbox_executions_total", "Executions answered, by status", ["status"], registry=r
        )
        self.queue_wait = Histogram(
            "sandbox_queue_wait_seconds",
            "Time from queueing to the start of execution",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.run_time = Histogram(
            "sandbox_run_seconds", "Wall time of executions", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("sandbox_queue_depth", "Jobs waiting to start", registry=r)
        self.in_flight = Gauge("sandbox_in_flight", "Jobs running now", registry=r)
        self.slots = Gauge("sandbox_slots", "Slots on this node", registry=r)
        self.slots_busy = Gauge("sandbox_slots_busy", "Slots running a job now", registry=r)
        self.slot_restarts = Counter(
            "sandbox_slot_restarts_total", "Zygotes restarted after dying", registry=r
        )
        self.reclaimed = Counter(
            "sandbox_reclaimed_jobs_total", "Jobs taken over from a dead worker", registry=r
        )
        self.refused = Counter(
            "sandbox_http_refused_total",
            "Requests refused whole: 429 queue full, 503 unavailable",
            ["code"],
            registry=r,
        )
        self.by_status: Tally[str] = Tally()

    def observe(self, result: ExecuteResult) -> None:
        status = result.status.value
        self.by_status[status] += 1
        self.executions.labels(status).inc()
        self.queue_wait.observe(result.queue_time_s)
        if result.wall_time_s:
            self.run_time.observe(result.wall_time_s)

    def watch(self, gauge: Gauge, read: Callable[[], float]) -> None:
        gauge.set_function(read)

    def render(self) -> bytes:
        return generate_latest(self.registry)
