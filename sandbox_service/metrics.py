"""Prometheus metrics an autoscaler and an operator can use, in a registry per process.

Names are stable (dashboards and the Kubernetes autoscaler read them): queue depth, in-flight
jobs, executions by status, queue-wait and run-time histograms, slot restarts, reclaimed jobs
and refused requests. The ``sandbox_tenant_*`` series say the same per tenant; their label
takes at most ``max_tenant_labels`` values (the tenants come from the key file, but a bound
keeps a mistake from flooding Prometheus): later tenants are counted as ``other``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandbox_service.models import ExecuteResult
from sandbox_service.tenants import DEFAULT_TENANT

OTHER = "other"
TenantCounts = Callable[[], dict[str, tuple[int, int]]]

# Most executions take milliseconds; the long tail is bounded by the maximum timeout.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class TenantGauges(Collector):
    """Per-tenant queue depth and in flight, read from the queue when scraped (no cost on the
    hot path)."""

    def __init__(self, metrics: Metrics, read: TenantCounts) -> None:
        self.metrics, self.read = metrics, read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "sandbox_tenant_queue_depth", "Jobs waiting to start, per tenant", labels=["tenant"]
        )
        running = GaugeMetricFamily(
            "sandbox_tenant_in_flight", "Jobs running now, per tenant", labels=["tenant"]
        )
        totals: dict[str, list[int]] = {}
        for tenant, (waiting, busy) in self.read().items():
            total = totals.setdefault(self.metrics.label(tenant), [0, 0])
            total[0] += waiting
            total[1] += busy
        for label, (waiting, busy) in sorted(totals.items()):
            depth.add_metric([label], waiting)
            running.add_metric([label], busy)
        yield depth
        yield running


class Metrics:
    def __init__(self, max_tenant_labels: int = 100) -> None:
        self.registry = CollectorRegistry()
        self.max_tenant_labels = max_tenant_labels
        self._labels: set[str] = set()
        r = self.registry
        self.executions = Counter(
            "sandbox_executions_total", "Executions answered, by status", ["status"], registry=r
        )
        self.dropped = Counter(
            "sandbox_dropped_total",
            "Jobs dropped because their client went away: queued (never ran) or running (killed)",
            ["where"],
            registry=r,
        )
        self.dropped_by: Tally[str] = Tally()
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
        self.stragglers = Gauge(
            "sandbox_stragglers",
            "Executions running past straggler_after_s, their core given back",
            registry=r,
        )
        self.slot_restarts = Counter(
            "sandbox_slot_restarts_total", "Zygotes restarted after dying", registry=r
        )
        self.slot_start_failures = Counter(
            "sandbox_slot_start_failures_total",
            "Failed zygote starts (start) and failed canary executions (canary); while they "
            "keep failing the slot waits longer between attempts and takes no work",
            ["kind"],
            registry=r,
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
        self.tenant_executions = Counter(
            "sandbox_tenant_executions_total",
            "Executions answered, by tenant and status",
            ["tenant", "status"],
            registry=r,
        )
        self.tenant_queue_wait = Histogram(
            "sandbox_tenant_queue_wait_seconds",
            "Time from queueing to the start of execution, per tenant",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tenant_slot_seconds = Counter(
            "sandbox_tenant_slot_seconds_total",
            "Seconds slots spent on each tenant's jobs, from taking one to answering it (what "
            "fair sharing divides by weight)",
            ["tenant"],
            registry=r,
        )
        self.tenant_refused = Counter(
            "sandbox_tenant_refused_total",
            "Batches refused because their tenant was over a quota (429), by quota",
            ["tenant", "quota"],
            registry=r,
        )
        self.auth_failures = Counter(
            "sandbox_auth_failures_total",
            "Requests refused for their API key (missing, malformed, invalid) or their source "
            "(rate_limited after too many failures)",
            ["reason"],
            registry=r,
        )
        self.by_status: Tally[str] = Tally()

    def label(self, tenant: str) -> str:
        """The tenant's label value: itself while fewer than the maximum are in use."""
        if tenant in self._labels:
            return tenant
        if len(self._labels) >= self.max_tenant_labels:
            return OTHER
        self._labels.add(tenant)
        return tenant

    def drop(self, where: str, count: int = 1) -> None:
        """``count`` jobs dropped because their client went away: ``queued`` (never started)
        or ``running`` (killed)."""
        self.dropped_by[where] += count
        self.dropped.labels(where).inc(count)

    def observe(self, result: ExecuteResult, tenant: str = DEFAULT_TENANT) -> None:
        status = result.status.value
        self.by_status[status] += 1
        self.executions.labels(status).inc()
        self.queue_wait.observe(result.queue_time_s)
        if result.wall_time_s:
            self.run_time.observe(result.wall_time_s)
        label = self.label(tenant)
        self.tenant_executions.labels(label, status).inc()
        self.tenant_queue_wait.labels(label).observe(result.queue_time_s)

    def watch_tenants(self, read: TenantCounts) -> None:
        self.registry.register(TenantGauges(self, read))

    def watch(self, gauge: Gauge, read: Callable[[], float]) -> None:
        gauge.set_function(read)

    def render(self) -> bytes:
        return generate_latest(self.registry)
