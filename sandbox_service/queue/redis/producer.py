"""The API node's face of the Redis queue: ``RedisQueue``, the ``Queue`` the routes submit to.

A batch is admitted in one script call (``scripts.ADMIT``: idempotency by ``id``, depth and
tenant quotas checked together), travels as chunks on the job stream, and its results come
back on this node's own reply stream, read by one blocking reader task: no polling. Chunks no
worker has taken by their start-by time are answered here ``queue_timeout``; a job never
answered ends ``internal_error``; a Redis that came back empty (its epoch) or a failover
that lost writes (the link's mark) has what it lost answered ``rejected`` (``reconcile``).
Guarantees and the design choices behind them: docs/redis.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status, WorkerInfo
from sandbox_service.queue.base import (
    DROPPED,
    ClientGone,
    Job,
    Queue,
    QueueFull,
    QueueUnavailable,
    Submission,
    answers,
    check_queued,
    check_rate,
    node_name,
    queue_timeout,
    result_for,
    scoped,
)
from sandbox_service.queue.redis.connection import (
    BLOCK_MS,
    RedisLink,
    Settlement,
    backoff,
    encode_job,
    loop_failed,
    stop_tasks,
)
from sandbox_service.queue.redis.keys import (
    FAIR_QUEUED,
    FAIR_RUNNING,
    GROUP,
    STATS_EXECUTIONS,
    STATS_RECLAIMED,
)
from sandbox_service.queue.redis.scripts import ADMIT, SETTLE
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT_TENANT, RateLimiter, Tenant

log = logging.getLogger(__name__)

READ_COUNT = 1000  # reply entries per XREAD
REPLY_TTL_S = 3600  # and goes away an hour after its API node stopped refreshing it
SWEEP_S = 0.25  # API node: how often deadlines are checked while requests wait
IDLE_SWEEP_S = 1.0
LOST_GRACE_S = 30.0  # beyond timeout + visibility before a job counts as lost
ORPHANS_MAX = 4096  # results that arrived before (or after) anyone waited for them
LOST_ADVICE = (
    "it may have run, but its result will never come: send it again (rejected: safe to resend)"
)

# ---------------------------------------------------------------- the API node's face


def tenant_counts(fair: dict[bytes, bytes]) -> dict[str, tuple[int, int]]:
    """(waiting, running) per tenant from the fair hash (``queued:`` counts both)."""
    queued: dict[str, int] = {}
    running: dict[str, int] = {}
    for field_name, value in fair.items():
        name = field_name.decode()
        if name.startswith(FAIR_QUEUED):
            queued[name.removeprefix(FAIR_QUEUED)] = int(value)
        elif name.startswith(FAIR_RUNNING):
            running[name.removeprefix(FAIR_RUNNING)] = int(value)
    return {
        t: (max(0, n - running.get(t, 0)), running.get(t, 0))
        for t, n in queued.items()
        if n or running.get(t, 0)
    }


@dataclass(eq=False)
class Sent:
    """A chunk this API node queued, until all of its jobs are answered."""

    id: bytes
    keys: list[str]
    start_by: float
    tenant: str = DEFAULT_TENANT
    delivered: bool = False  # a worker took it: from now on only workers answer it


@dataclass
class Cluster:
    """What Redis says about the whole deployment, for ``/v1/status``."""

    depth: int
    workers: list[WorkerInfo]
    isolation: dict[str, bool | str]
    executions: dict[str, int]
    reclaimed: int

    @property
    def running(self) -> int:
        return sum(w.busy for w in self.workers)


class RedisQueue(Queue):
    def __init__(self, settings: Settings, metrics: Metrics, node: str | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.link = RedisLink(settings, metrics)
        self.keys = self.link.keys
        self.node = node or f"{node_name()}-{secrets.token_hex(3)}"
        self.reply = self.keys.replies(self.node)
        self.cluster_depth = 0  # jobs admitted and not settled, as last read from Redis
        self._seq = itertools.count()
        self._waiting: dict[str, Job] = {}  # job key -> a job whose result this node awaits
        self._sent: dict[bytes, Sent] = {}
        self._orphans: OrderedDict[str, bytes] = OrderedDict()
        self._last_id: bytes = b"0-0"
        self._closing = False
        self._closed = False
        self._reject: str | None = None  # set when the grace period is over
        self._tasks: list[asyncio.Task[None]] = []
        self._next_lost_check = 0.0
        self._rates = RateLimiter()
        self._tenant_counts: dict[str, tuple[int, int]] = {}
        self._recovery: asyncio.Task[None] | None = None
        self.lost = Counter(
            "sandbox_redis_lost_requests_total",
            "Requests answered rejected because Redis lost them (a failover to a replica that "
            "lagged, or a Redis that restarted empty)",
            registry=metrics.registry,
        )
        self._recheck = False
        self.link.on_loss = self._lost_writes
        self._posted: set[str] = set()  # abandoned job keys already told to the workers

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def tenant_counts(self) -> dict[str, tuple[int, int]]:
        """(waiting, running) per tenant across the deployment, as the last sweep read them."""
        return self._tenant_counts

    async def start(self) -> None:
        try:
            await self.sweep()
        except QueueUnavailable as exc:
            log.warning("%s; this node answers 503 until it is reachable", exc)
        self._tasks = [
            asyncio.create_task(self._read_forever(), name="redis-replies"),
            asyncio.create_task(self._sweep_forever(), name="redis-sweep"),
        ]
        log.info("API node %s on Redis %s", self.node, self.link.where)

    # ------------------------------------------------------------- submit

    def _jobs(
        self, requests: Sequence[ExecuteRequest], tenant: str, start_by: float
    ) -> tuple[list[Job], list[Job]]:
        """One job per request, one per distinct id: (jobs in request order, distinct jobs)."""
        now = time.time()
        by_id: dict[str, Job] = {}
        jobs = []
        for request in requests:
            job = by_id.get(request.id) if request.id is not None else None
            if job is None:
                job = Job(
                    request, now, start_by, key=f"{self.node}.{next(self._seq)}", tenant=tenant
                )
                if request.id is not None:
                    by_id[request.id] = job
            jobs.append(job)
        return jobs, list(dict.fromkeys(jobs))

    def _admit_call(
        self, fresh: list[Job], offer: bytes, tenant: Tenant
    ) -> tuple[list[str], list[Any]]:
        s, k = self.settings, self.keys
        names = [k.jobs, k.depth, k.epoch, k.fair, k.active, k.bell, k.ready(tenant.name)]
        claim_ttl_s = s.max_queue_wait_s + s.max_timeout_s + s.visibility_timeout_s + LOST_GRACE_S
        # A tenant with max_in_flight gets chunks no larger, so that take can honour it.
        chunk_size = min(s.chunk_size, tenant.max_in_flight or s.chunk_size)
        args: list[Any] = [
            s.max_queue_depth,
            chunk_size,
            self.reply,
            GROUP,
            int(claim_ttl_s * 1000),
            len(fresh),
            offer,
            tenant.name,
            repr(float(tenant.weight)),
            tenant.max_in_flight,
            tenant.max_queued,
        ]
        for job in fresh:
            slot = 0
            if job.request.id is not None:
                names.extend(k.of_id(scoped(tenant.name, job.request.id)))
                slot = (len(names) - 7) // 3
            args += [job.key, slot, encode_job(job)]
        return names, args

    def _refuse(self, tenant: Tenant, reply: list[Any]) -> None:
        """The admission script said no: QueueFull, or QuotaExceeded for the tenant's own."""
        s = self.settings
        held, wanted = int(reply[1]), int(reply[3])
        self._rates.refund(tenant, wanted)
        if reply[0] == b"quota":
            check_queued(tenant, held, wanted, s.retry_after_s)  # raises, with the same words
        self.cluster_depth = held
        raise QueueFull(held, s.max_queue_depth, wanted, s.retry_after_s)

    async def run(self, submission: Submission) -> list[ExecuteResult]:
        if self._closing:
            raise QueueUnavailable("this API node is shutting down and takes no new work")
        if submission.gone.is_set():
            raise ClientGone(DROPPED)
        tenant = submission.tenant
        start_by = submission.start_by(time.time(), self.settings.max_queue_wait_s)
        jobs, fresh = self._jobs(submission.requests, tenant.name, start_by)
        check_rate(self._rates, tenant, len(fresh))  # per API node: see docs/tenants.md
        offer = self.link.epoch_offer()
        try:
            reply = await self.link.script(ADMIT, *self._admit_call(fresh, offer, tenant))
        except (ResponseError, QueueUnavailable) as exc:
            self._rates.refund(tenant, len(fresh))
            if isinstance(exc, QueueUnavailable):
                raise
            raise QueueUnavailable(f"Redis at {self.link.where} refused the work: {exc}") from exc
        if self.link.epoch_changed(reply[2], offer):
            self._lost_everything()  # before this batch joins the waiting: it is not lost
        if reply[0] in (b"full", b"quota"):
            self._refuse(tenant, reply)
        self.cluster_depth = int(reply[1])
        futures = self._register(fresh, reply)
        try:
            return await answers([futures[job] for job in jobs], submission.gone)
        except ClientGone:
            self._abandon(fresh)
            raise

    def _abandon(self, jobs: list[Job]) -> None:
        """The client went away: jobs no other request on this node waits for are marked;
        the next sweep drops their chunks that no worker has taken (``_due``) and tells the
        workers the keys of the others (``abandoned``: they drop or kill them)."""
        for job in jobs:
            waiting = self._waiting.get(job.key)
            if waiting is not None:
                waiting.askers -= 1
                if waiting.askers <= 0:
                    waiting.abandoned.set()

    def _register(self, fresh: list[Job], reply: list[Any]) -> dict[Job, asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        start_by, tenant = fresh[0].start_by, fresh[0].tenant
        sent = [Sent(chunk_id, [], start_by, tenant) for chunk_id in reply[3 + 2 * len(fresh) :]]
        futures: dict[Job, asyncio.Future[Any]] = {}
        for i, job in enumerate(fresh):
            kind, value = reply[3 + 2 * i], reply[4 + 2 * i]
            if kind == b"r":  # a stored result of this id
                futures[job] = loop.create_future()
                futures[job].set_result(ExecuteResult.model_validate_json(value))
                continue
            if kind == b"j":  # the id is running: wait for that job's result
                job.key = value.decode()
            else:
                sent[int(value) - 1].keys.append(job.key)
            futures[job] = self._await(job)
        for chunk in sent:
            self._sent[chunk.id] = chunk
        return futures

    def _await(self, job: Job) -> asyncio.Future[ExecuteResult]:
        joined = self._waiting.get(job.key)
        if joined is not None and joined.future is not None:
            joined.askers += 1
            return joined.future
        job.future = asyncio.get_running_loop().create_future()
        self._waiting[job.key] = job
        early = self._orphans.pop(job.key, None)
        if early is not None:
            self._deliver(job.key, early)
        return job.future

    # ------------------------------------------------------------- answers

    def _deliver(self, key: str, body: bytes) -> None:
        job = self._waiting.pop(key, None)
        if job is None:  # a second answer (dropped), or one that came before its waiter
            self._orphans[key] = body
            while len(self._orphans) > ORPHANS_MAX:
                self._orphans.popitem(last=False)
            return
        self._resolve(job, ExecuteResult.model_validate_json(body))

    def _resolve(self, job: Job, result: ExecuteResult) -> None:
        if result.message != DROPPED:
            self.metrics.observe(result, job.tenant)
        if job.future is not None and not job.future.done():
            job.future.set_result(result)

    def _answer_here(self, job: Job, status: Status, message: str) -> None:
        self._waiting.pop(job.key, None)
        self._resolve(job, result_for(job, status, message))

    async def _read_forever(self) -> None:
        """The one reader of this node's reply stream: blocks in Redis, never polls."""
        failures = 0
        while not self._closed:
            try:
                streams = await self.link.call(
                    "xread", {self.reply: self._last_id}, count=READ_COUNT, block=BLOCK_MS
                )
            except Exception as exc:
                loop_failed("reading replies", exc)
                await asyncio.sleep(backoff(failures))
                failures += 1
                continue
            failures = 0
            for _stream, entries in streams or []:
                for entry_id, fields in entries:
                    self._last_id = entry_id
                    for key, body in fields.items():
                        self._deliver(key.decode(), body)

    # ------------------------------------------------------------- deadlines

    def _open(self, chunk: Sent) -> list[Job]:
        return [self._waiting[k] for k in chunk.keys if k in self._waiting]

    def _due(self, now: float) -> list[Settlement]:
        """Chunks no worker has taken whose start-by time passed (or, after the grace
        period, all of them): answered by this node, if still undelivered when it looks."""
        due = []
        for chunk in list(self._sent.values()):
            open_jobs = self._open(chunk)
            if not open_jobs:
                del self._sent[chunk.id]
            elif not chunk.delivered and all(j.abandoned.is_set() for j in open_jobs):
                results = [(j, result_for(j, Status.rejected, DROPPED)) for j in open_jobs]
                due.append(self._untaken(chunk, results))
            elif not chunk.delivered and (self._reject is not None or chunk.start_by <= now):
                if self._reject is not None:
                    results = [(j, result_for(j, Status.rejected, self._reject)) for j in open_jobs]
                else:
                    wait = self.settings.max_queue_wait_s
                    results = [(j, queue_timeout(j, wait)) for j in open_jobs]
                due.append(self._untaken(chunk, results))
        return due

    def _untaken(self, chunk: Sent, results: list[tuple[Job, ExecuteResult]]) -> Settlement:
        """Answering a chunk from this node, if no worker has taken it when the call runs."""
        return Settlement(
            chunk.id,
            self.reply,
            len(chunk.keys),
            results,
            only_if_undelivered=True,
            tenant=chunk.tenant,
            held=False,
        )

    async def sweep(self) -> None:
        """One round trip: notice a Redis that lost its data, read the depth, keep the reply
        stream trimmed and alive, and answer chunks whose deadline passed untaken."""
        now = time.time()
        due = self._due(now)
        ttl = self.settings.result_ttl_s
        forget_at = now + self.settings.max_queue_wait_s + self.settings.max_timeout_s
        abandoned = {
            key: forget_at
            for key, job in self._waiting.items()
            if job.abandoned.is_set() and key not in self._posted
        }
        self._posted &= set(self._waiting)
        self._posted |= set(abandoned)

        offers: list[bytes] = []  # the pipeline runs twice if a script was missing

        def fill(pipe: Pipeline) -> None:
            offers.append(self.link.add_epoch(pipe))
            pipe.get(self.keys.depth)
            pipe.xtrim(self.reply, minid=self._last_id, approximate=False)
            pipe.expire(self.reply, REPLY_TTL_S)
            pipe.hgetall(self.keys.fair)
            pipe.zremrangebyscore(self.keys.abandoned, "-inf", now)
            if abandoned:
                pipe.zadd(self.keys.abandoned, abandoned)
            for settlement in due:
                self.link.add_script(pipe, SETTLE, *settlement.call(self.keys, ttl))

        results = await self.link.pipeline(fill)
        if self.link.epoch_changed(results[0], offers[-1]):
            self._lost_everything()
            return
        self.cluster_depth = int(results[1] or 0)
        self._tenant_counts = tenant_counts(results[4])
        for settlement, outcome in zip(due, results[6 + bool(abandoned) :], strict=True):
            # Not there if a submit noticed a Redis restart (and forgot every chunk) meanwhile.
            chunk = self._sent.get(settlement.chunk_id)  # type: ignore[arg-type]
            if outcome == -1 and chunk is not None:
                chunk.delivered = True
            elif settlement.results and settlement.results[0][1].message == DROPPED:
                self.metrics.drop("queued", len(settlement.results))

    def _lost_everything(self) -> None:
        log.error(
            "Redis at %s lost its data (restarted empty?): answering %d pending requests rejected",
            self.link.where,
            len(self._waiting),
        )
        message = (
            f"Redis at {self.link.where} lost the queue (it restarted without its data) while "
            f"this request was pending; {LOST_ADVICE}"
        )
        for job in list(self._waiting.values()):
            self.lost.inc()
            self._answer_here(job, Status.rejected, message)
        self._sent.clear()
        self._last_id = b"0-0"

    def _lost_writes(self) -> None:
        """The link saw Redis lose writes it had acknowledged: find out what of ours went."""
        self._recheck = True
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.create_task(self._recover(), name="redis-recover")

    async def _recover(self) -> None:
        failures = 0
        while self._recheck and not self._closed:
            self._recheck = False
            try:
                await self.reconcile()
            except Exception as exc:
                loop_failed("checking what Redis lost", exc, logging.WARNING)
                self._recheck = True
                await asyncio.sleep(backoff(failures))
                failures += 1

    async def reconcile(self) -> None:
        """One round trip after Redis lost writes (a failover to a lagging replica): each
        chunk of ours the primary no longer has, and each joined id no longer running, whose
        result did not come is answered ``rejected`` as lost. Its existence is asked before the
        reply stream is read: a chunk settled meanwhile left its results there."""
        k, s = self.keys, self.settings
        claim_ttl_ms = int(1000 * (s.max_queue_wait_s + s.max_timeout_s
                                   + s.visibility_timeout_s + LOST_GRACE_S))  # fmt: skip
        chunks = [chunk for chunk in self._sent.values() if self._open(chunk)]
        ours = {key for chunk in chunks for key in chunk.keys}
        joined = [job for job in self._waiting.values()
                  if job.key not in ours and job.request.id is not None]  # fmt: skip

        def fill(pipe: Pipeline) -> None:
            for chunk in chunks:
                pipe.xrange(k.jobs, chunk.id, chunk.id, count=1)
            for job in joined:
                result, claim, waiters = k.of_id(scoped(job.tenant, str(job.request.id)))
                pipe.sadd(waiters, self.reply)  # the join itself may be what was lost
                pipe.pexpire(waiters, claim_ttl_ms)
                pipe.get(claim)
                pipe.get(result)
            pipe.xrange(self.reply, "-", "+")

        results = await self.link.pipeline(fill)
        entries = results[-1]
        for _entry_id, fields in entries:
            for key, body in fields.items():
                self._deliver(key.decode(), body)
        self._last_id = entries[-1][0] if entries else b"0-0"  # the new primary's stream
        lost = self._gone(chunks, joined, results)
        if lost:
            log.error(
                "Redis at %s lost %d requests this node waited for (a failover?): answering "
                "them rejected",
                self.link.where,
                len(lost),
            )
        message = f"Redis at {self.link.where} lost this request in a failover; {LOST_ADVICE}"
        for job in lost:
            self.lost.inc()
            self._answer_here(job, Status.rejected, message)

    def _gone(self, chunks: list[Sent], joined: list[Job], results: list[Any]) -> list[Job]:
        """What ``reconcile`` found lost: the open jobs of chunks Redis no longer has, and
        joined jobs neither running nor answered."""
        lost = []
        for chunk, found in zip(chunks, results, strict=False):
            if not found:
                lost += self._open(chunk)
                self._sent.pop(chunk.id, None)
        for i, job in enumerate(joined):
            claim, stored = results[len(chunks) + 4 * i + 2 : len(chunks) + 4 * i + 4]
            if job.key not in self._waiting or claim == job.key.encode():
                continue  # answered, or still running: its result comes to us
            if stored is not None:
                self._deliver(job.key, stored)
            else:
                lost.append(job)
        return lost

    def _answer_lost(self, now: float) -> None:
        """No request waits for ever: past every deadline a worker could still meet, the
        job is answered here (every worker gone, or the queue lost it)."""
        grace = self.settings.visibility_timeout_s + LOST_GRACE_S
        for job in list(self._waiting.values()):
            if now > job.start_by + job.request.timeout_s + grace:
                self._answer_here(
                    job,
                    Status.internal_error,
                    (
                        f"no result {grace:g} s after this job's deadline: no worker took it over "
                        "(are worker nodes running?) or the queue lost it; it may have run"
                    ),
                )

    async def _sweep_forever(self) -> None:
        while not self._closed:
            await asyncio.sleep(SWEEP_S if self._waiting else IDLE_SWEEP_S)
            try:
                await self.sweep()
            except Exception as exc:
                loop_failed("sweep", exc)
            now = time.time()
            if now >= self._next_lost_check:
                self._next_lost_check = now + IDLE_SWEEP_S
                self._answer_lost(now)

    # ------------------------------------------------------------- lifecycle, reports

    def begin_shutdown(self) -> None:
        self._closing = True

    async def reject_undelivered(self, message: str) -> None:
        """Grace period over: chunks no worker has taken are answered ``rejected``."""
        self._reject = message
        with contextlib.suppress(QueueUnavailable, ResponseError):
            await self.sweep()

    async def ready(self) -> tuple[bool, str]:
        if self._closing:
            return False, "shutting down"
        try:
            await self.link.call("ping")
        except (QueueUnavailable, ResponseError) as exc:
            return False, str(exc)
        return True, ""

    async def cluster(self) -> Cluster:
        k = self.keys
        depth, names, stats = await self.link.pipeline(
            lambda p: (p.get(k.depth), p.smembers(k.workers), p.hgetall(k.stats))
        )
        ordered = sorted(n.decode() for n in names)
        beats = await self.link.call("mget", [k.worker(n) for n in ordered]) if ordered else []
        now, workers = time.time(), []
        isolation: dict[str, bool | str] = {}
        for name, beat in zip(ordered, beats, strict=True):
            if beat is None:  # stopped reporting: gone
                await self.link.call("srem", k.workers, name)
                continue
            info = json.loads(beat)
            isolation = isolation or info.get("isolation", {})
            workers.append(
                WorkerInfo(
                    name=name,
                    slots=info["slots"],
                    busy=info["busy"],
                    executions=info["executions"],
                    healthy_slots=info.get("healthy_slots", info["slots"]),
                    cores=info.get("cores", 0),
                    stragglers=info.get("stragglers", 0),
                    last_seen_s=round(now - info["at"], 3),
                )
            )
        counts = {k.decode(): int(v) for k, v in stats.items()}
        executions = {
            key.removeprefix(STATS_EXECUTIONS): value
            for key, value in counts.items()
            if key.startswith(STATS_EXECUTIONS)
        }
        return Cluster(
            int(depth or 0), workers, isolation, executions, counts.get(STATS_RECLAIMED, 0)
        )

    async def depth(self) -> tuple[int, int]:
        cluster = await self.cluster()
        return max(0, cluster.depth - cluster.running), cluster.running

    async def close(self) -> None:
        self._closing = self._closed = True
        await stop_tasks(self._tasks)
        self._tasks = []
        gone = "the API node stopped before this result arrived; it may still run"
        for job in list(self._waiting.values()):
            self._answer_here(job, Status.internal_error, gone)
        with contextlib.suppress(QueueUnavailable, ResponseError):
            await self.link.call("delete", self.reply)
        await self.link.close()
