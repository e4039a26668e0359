"""The worker node's face of the Redis queue: the ``JobSource`` its slots take jobs from.

It takes a chunk at a time while fewer jobs than slots wait in its hands (the ``take`` script
chooses whose: the tenant whose turn it is, ``queue.fair``), blocks on the bell when there is
nothing it may take, settles each chunk once all its jobs are answered (chunks that finish
together share one round trip; the settle tells Redis what the chunk really took), sends a
heartbeat that also keeps its chunks from being reclaimed, and takes over the chunks of
workers that went silent. The design: docs/redis.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.typing import StreamIdT

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.queue.base import DROPPED, Job, QueueUnavailable, park, result_for, wake
from sandbox_service.queue.fair import INITIAL_MEAN_S
from sandbox_service.queue.redis.connection import (
    BLOCK_MS,
    CONNECT_TIMEOUT_S,
    RedisLink,
    Settlement,
    backoff,
    decode_jobs,
    loop_failed,
    stop_tasks,
)
from sandbox_service.queue.redis.keys import GROUP, STATS_EXECUTIONS, STATS_RECLAIMED
from sandbox_service.queue.redis.scripts import SETTLE, TAKE
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT_TENANT

log = logging.getLogger(__name__)

RECLAIM_COUNT = 32  # chunks taken over per heartbeat
SHUTDOWN_WRITE_S = 10.0  # a stopping worker gives up settling after this (Redis down)
REPLAY_MAX = 4096  # settled chunks kept to settle again after a failover lost them

# ---------------------------------------------------------------- the worker node's face


@dataclass(eq=False)
class Held:
    """A chunk a worker took, until it is settled."""

    id: bytes
    reply: str
    jobs: list[Job]
    tenant: str = DEFAULT_TENANT
    estimate: float = 0.0  # what take charged the tenant for it
    results: dict[Job, ExecuteResult] = field(default_factory=dict)
    running: int = 0
    settling: bool = False
    took: float = 0.0  # slot-seconds its jobs used so far
    ran: int = 0


Fields = dict[bytes, bytes]


def _fields(flat: list[bytes]) -> Fields:
    """A stream entry's fields as a script returns them (a flat list) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


WOKE_TTL_S = 60


class RedisJobSource:
    """A worker's ``JobSource``: takes chunks from the stream, hands their jobs to the slots,
    settles each chunk once all its jobs are answered, reports a heartbeat and takes over
    the chunks of workers that went silent."""

    def __init__(
        self, settings: Settings, metrics: Metrics, name: str, burst: bool = False
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.name = name
        self.burst = burst
        self.link = RedisLink(settings, metrics)
        self.keys = self.link.keys
        self.cluster_depth = 0
        self.finished = asyncio.Event()  # burst mode: nothing left to take
        self.describe: Callable[[], dict[str, Any]] = dict
        self._unstarted: deque[Job] = deque()  # taken, not yet started
        self._getters: deque[asyncio.Future[None]] = deque()
        self._held: dict[bytes, Held] = {}
        self._chunk_of: dict[Job, Held] = {}
        self._settling: list[Settlement] = []
        self._writing = False
        self._write_wake = asyncio.Event()
        self._want_more = asyncio.Event()
        self._taking = True
        self._closed = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._tenants: list[str] = []  # tenants take may choose from (it asks for more)
        self._settled: deque[tuple[float, Settlement]] = deque()  # sent again if Redis lost them
        self._idle = False  # the last take found nothing: the next waits on the bell first
        self.link.on_loss = self._lost_writes

    async def start(self, describe: Callable[[], dict[str, Any]]) -> None:
        self.describe = describe
        try:
            await self._ensure_group()
        except QueueUnavailable as exc:
            log.warning("%s; retrying", exc)
        self._tasks = {
            "fetch": asyncio.create_task(self._fetch_forever(), name="redis-fetch"),
            "write": asyncio.create_task(self._write_forever(), name="redis-write"),
            "beat": asyncio.create_task(self._beat_forever(), name="redis-heartbeat"),
        }
        log.info("worker %s on Redis %s", self.name, self.link.where)

    async def _ensure_group(self) -> None:
        try:
            await self.link.call("xgroup_create", self.keys.jobs, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    @property
    def ready_to_work(self) -> bool:
        return self._taking and self.link.reachable

    # ------------------------------------------------------------- JobSource

    async def get(self) -> Job | None:
        while self._taking:
            if self._unstarted:
                job = self._unstarted.popleft()
                self._chunk_of[job].running += 1
                job.started = time.monotonic()
                if len(self._unstarted) < self.settings.slots:
                    self._want_more.set()
                return job
            self._want_more.set()
            await park(self._getters)
        return None

    async def done(self, job: Job, result: ExecuteResult) -> None:
        held = self._chunk_of.pop(job)
        held.running -= 1
        held.took += time.monotonic() - job.started
        held.ran += 1
        held.results[job] = result
        self._settle_if_done(held)
        self._want_more.set()

    async def retry(self, job: Job) -> None:
        held = self._chunk_of[job]
        held.running -= 1
        held.took += time.monotonic() - job.started
        job.attempts += 1
        self._unstarted.appendleft(job)
        wake(self._getters, 1)
        self._settle_if_done(held)

    # ------------------------------------------------------------- taking chunks

    async def _fetch_forever(self) -> None:
        failures = 0
        while self._taking:
            if len(self._unstarted) >= self.settings.slots or self._holding_a_retry():
                self._want_more.clear()
                await self._want_more.wait()
                continue
            try:
                got = await self._take()
            except Exception as exc:
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    await self._recreate_group(exc)
                    continue
                loop_failed("taking jobs", exc)
                await asyncio.sleep(backoff(failures))
                failures += 1
                continue
            failures = 0
            if got is None:
                continue
            if not got and self.burst and not await self._more_in_burst():
                self.finished.set()
                return

    async def _take(self) -> bool | None:
        """One call of the take script, after waiting on the bell when the last found nothing
        (in one round trip: a lone request's wake-up carries its chunk): True if a chunk came
        (now held), None to call again at once (it named tenants we did not know), False if
        there was nothing to take."""
        k = self.keys
        names = [k.jobs, k.fair, k.active, k.bell, k.woke(self.name),
                 *(k.ready(t) for t in self._tenants)]  # fmt: skip
        args = [GROUP, self.name, len(self._tenants), *self._tenants, repr(INITIAL_MEAN_S)]
        if self._idle and not self.burst:

            def wait_then_take(pipe: Pipeline) -> None:
                pipe.blmove(k.bell, k.woke(self.name), BLOCK_MS // 1000, "LEFT", "RIGHT")
                pipe.expire(k.woke(self.name), WOKE_TTL_S)  # left if we vanish just now
                self.link.add_script(pipe, TAKE, names, args)

            *_, reply = await self.link.pipeline(wait_then_take)
        elif self._settling:
            reply = await self._settle_then_take(names, args)
        else:
            reply = await self.link.script(TAKE, names, args)
        kind = reply[0]
        if kind == b"tenants":
            self._tenants = sorted({*self._tenants, *(t.decode() for t in reply[1:])})
            self._idle = False  # at once: a token that woke us waits for that take
            return None
        self._idle = kind != b"chunk"
        if kind == b"chunk":
            self._hold(reply[1], _fields(reply[2]), float(reply[3]))
            return True
        return False

    async def _settle_then_take(self, names: list[str], args: list[Any]) -> Any:
        """The settlements waiting to be written, then a take, in one round trip: a job that
        ends frees a slot, so its chunk's settle and the next take are due together (singles
        under load: ~1 round trip per execution on the worker instead of 2). A settle that
        fails goes back to the writer, which retries it."""
        batch, self._settling = self._settling, []

        def settle_then_take(pipe: Pipeline) -> None:
            self._fill_settle(pipe, batch)
            self.link.add_script(pipe, TAKE, names, args)

        try:
            *settled, reply = await self.link.pipeline(settle_then_take, each=True)
        except BaseException:
            self._unsettled(batch)
            raise
        failed = next((r for r in settled if isinstance(r, Exception)), None)
        if failed is not None:
            loop_failed(f"settling {len(batch)} chunks (retrying)", failed, logging.WARNING)
            self._unsettled(batch)
        else:
            self._settled_now(batch)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _unsettled(self, batch: list[Settlement]) -> None:
        self._settling[:0] = batch
        self._write_wake.set()

    def _settled_now(self, batch: list[Settlement]) -> None:
        for settlement in batch:
            self._held.pop(settlement.chunk_id, None)  # type: ignore[arg-type]
        self._keep_settled(batch)

    def _holding_a_retry(self) -> bool:
        """A job that was in the hands of a worker that vanished may be what killed it: while
        one is in ours, take nothing more, so that if it kills us too nothing else is lost
        with it (and charged an attempt it never had)."""
        return any(job.attempts > 0 for job in self._chunk_of)

    async def _recreate_group(self, exc: ResponseError) -> None:
        log.warning("%s: creating the consumer group again (Redis restarted empty?)", exc)
        with contextlib.suppress(QueueUnavailable):
            await self._ensure_group()

    async def _more_in_burst(self) -> bool:
        """Burst mode found the stream empty: is there still something to wait for?"""
        if self._held:
            await asyncio.sleep(0.05)
            return True
        got = await self.link.call(
            "xautoclaim",
            self.keys.jobs,
            GROUP,
            self.name,
            int(self.settings.visibility_timeout_s * 1000),
            "0-0",
            count=RECLAIM_COUNT,
        )
        return self._reclaim(got[1]) > 0

    def _parse(self, entry_id: bytes, fields: Fields) -> tuple[str, str, list[Job]] | None:
        """(reply stream, tenant, jobs) of a chunk; a malformed one is removed and None
        returned."""
        tenant = fields.get(b"tenant", DEFAULT_TENANT.encode()).decode(errors="replace")
        try:
            return fields[b"reply"].decode(), tenant, decode_jobs(fields[b"jobs"])
        except (KeyError, ValueError) as exc:
            log.error("removing malformed chunk %r: %s", entry_id, exc)
            n = int(fields.get(b"n", b"0"))
            nobody = self.keys.replies("nobody")
            self._queue_settle(Settlement(entry_id, nobody, n, [], tenant=tenant))
            return None

    def _hold(self, entry_id: bytes, fields: Fields, estimate: float) -> None:
        parsed = self._parse(entry_id, fields)
        if parsed is None:
            return
        reply, tenant, jobs = parsed
        held = Held(entry_id, reply, jobs, tenant, estimate)
        self._held[entry_id] = held
        for job in jobs:
            self._chunk_of[job] = held
        self._unstarted.extend(jobs)
        wake(self._getters, len(jobs))

    def _reclaim(self, entries: list[tuple[bytes, dict[bytes, bytes] | None]]) -> int:
        """Chunks of a silent worker: each job counts one more attempt and goes back alone
        (so a poison job cannot take its chunk with it), or is answered once it had them all."""
        taken = 0
        limit = self.settings.max_attempts
        for entry_id, fields in entries:
            parsed = self._parse(entry_id, fields) if fields is not None else None
            if parsed is None:
                continue
            reply, tenant, jobs = parsed
            results, again = [], []
            for job in jobs:
                job.attempts += 1
                if job.attempts >= limit:
                    result = result_for(
                        job,
                        Status.internal_error,
                        (
                            f"the worker running this job vanished {job.attempts} times (killed, "
                            f"or its machine lost); a job that kills its worker is not run again "
                            f"(max_attempts={limit})"
                        ),
                        self.name,
                    )
                    self.metrics.observe(result)
                    results.append((job, result))
                else:
                    again.append([job])
            self._queue_settle(
                Settlement(
                    entry_id, reply, len(jobs), results, again, reclaimed=len(jobs), tenant=tenant
                )
            )
            taken += len(jobs)
        if taken:
            log.warning(
                "took over %d jobs of workers silent for %g s",
                taken,
                self.settings.visibility_timeout_s,
            )
            self.metrics.reclaimed.inc(taken)
        return taken

    # ------------------------------------------------------------- settling chunks

    def _settle_if_done(self, held: Held) -> None:
        if held.settling or held.running:
            return
        if len(held.results) < len(held.jobs) and self._taking:
            return
        held.settling = True
        unanswered = [job for job in held.jobs if job not in held.results]
        for job in unanswered:  # only when stopping: they go back untouched
            self._chunk_of.pop(job, None)
            with contextlib.suppress(ValueError):
                self._unstarted.remove(job)
        self._queue_settle(
            Settlement(
                held.id,
                held.reply,
                len(held.jobs),
                list(held.results.items()),
                [unanswered] if unanswered else [],
                tenant=held.tenant,
                estimate=held.estimate,
                took=held.took,
                ran=held.ran,
            )
        )

    def _queue_settle(self, settlement: Settlement) -> None:
        self._settling.append(settlement)
        self._write_wake.set()

    def _fill_settle(self, pipe: Pipeline, batch: list[Settlement]) -> None:
        statuses: Tally[str] = Tally()
        reclaimed = 0
        for settlement in batch:
            self.link.add_script(
                pipe, SETTLE, *settlement.call(self.keys, self.settings.result_ttl_s)
            )
            statuses.update(result.status.value for _, result in settlement.results)
            reclaimed += settlement.reclaimed
        for status, count in statuses.items():
            pipe.hincrby(self.keys.stats, STATS_EXECUTIONS + status, count)
        if reclaimed:
            pipe.hincrby(self.keys.stats, STATS_RECLAIMED, reclaimed)

    async def _write_forever(self) -> None:
        """Settles what is ready, everything that finished meanwhile in one round trip."""
        failures = 0
        while not self._closed:
            await self._write_wake.wait()
            self._write_wake.clear()
            await asyncio.sleep(0)  # a take due in this same tick carries them instead
            while self._settling:
                batch, self._settling = self._settling, []
                self._writing = True
                try:
                    await self.link.pipeline(functools.partial(self._fill_settle, batch=batch))
                except Exception as exc:
                    loop_failed(f"settling {len(batch)} chunks (retrying)", exc, logging.WARNING)
                    self._settling[:0] = batch
                    await asyncio.sleep(backoff(failures))
                    failures += 1
                    continue
                finally:
                    self._writing = False
                failures = 0
                self._settled_now(batch)

    def _keep_settled(self, batch: list[Settlement]) -> None:
        """Settlements of the last visibility timeout, to send again if Redis loses them:
        their chunks' results then still come, without running them again."""
        now = time.monotonic()
        self._settled.extend((now, settlement) for settlement in batch)
        horizon = now - self.settings.visibility_timeout_s
        while self._settled and (self._settled[0][0] < horizon or len(self._settled) > REPLAY_MAX):
            self._settled.popleft()

    def _lost_writes(self) -> None:
        """Redis lost writes it had acknowledged (a failover): settle again what was settled
        lately. Settling twice is safe: the second finds its chunk gone and only publishes
        the results again, which the API node drops if it has them."""
        again = [settlement for _, settlement in self._settled]
        self._settled.clear()
        if again:
            log.warning("settling %d recent chunks again after Redis lost writes", len(again))
            self._settling[:0] = again
            self._write_wake.set()

    # ------------------------------------------------------------- heartbeat

    async def _beat_forever(self) -> None:
        while not self._closed:
            try:
                await self.beat()
            except Exception as exc:
                loop_failed("heartbeat", exc)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def beat(self) -> None:
        """One round trip: say we are alive, keep the chunks we hold from being reclaimed,
        and take over chunks of workers that went silent."""
        k, s = self.keys, self.settings
        info = json.dumps({**self.describe(), "at": time.time()})
        holding: list[StreamIdT] = list(self._held)
        taking = self._taking
        jobs = list(self._chunk_of)  # held, not answered: has any client gone away?

        def fill(pipe: Pipeline) -> None:
            pipe.set(k.worker(self.name), info, px=int(3 * s.heartbeat_interval_s * 1000) + 1000)
            pipe.sadd(k.workers, self.name)
            pipe.get(k.depth)
            if holding:
                pipe.xclaim(k.jobs, GROUP, self.name, 0, holding, justid=True)
            if jobs:
                pipe.zmscore(k.abandoned, [job.key for job in jobs])
            if taking:
                pipe.xautoclaim(
                    k.jobs,
                    GROUP,
                    self.name,
                    int(s.visibility_timeout_s * 1000),
                    "0-0",
                    count=RECLAIM_COUNT,
                )

        results = await self.link.pipeline(fill)
        self.cluster_depth = int(results[2] or 0)
        if jobs:
            scores = results[3 + bool(holding)]
            self._drop([job for job, score in zip(jobs, scores, strict=True) if score is not None])
        if taking and self._taking:
            # XAUTOCLAIM answers [next id, entries] on Redis 6.2 and [next id, entries,
            # ids of deleted entries] since 7.0: the entries are [1] on both.
            self._reclaim(results[-1][1])

    def _drop(self, jobs: list[Job]) -> None:
        """Jobs whose client went away (the API node listed them): those not started are
        answered to nobody without running; running ones without an id are killed by the
        slot loop."""
        dropped = 0
        for job in jobs:
            held = self._chunk_of.get(job)
            if held is None or job.abandoned.is_set():
                continue
            if job not in self._unstarted and job.request.id is not None:
                continue  # running with an id: its result is kept for a client asking again
            job.abandoned.set()
            if job in self._unstarted:
                self._unstarted.remove(job)
                del self._chunk_of[job]
                held.results[job] = result_for(job, Status.rejected, DROPPED, self.name)
                dropped += 1
                self._settle_if_done(held)
        if dropped:
            self.metrics.drop("queued", dropped)
            self._want_more.set()

    # ------------------------------------------------------------- stopping

    def stop_taking(self) -> None:
        """Take no new job; chunks settle as their running jobs finish (the rest go back)."""
        if not self._taking:
            return
        self._taking = False
        self._want_more.set()
        wake(self._getters, len(self._getters))
        for held in list(self._held.values()):
            self._settle_if_done(held)

    async def close(self) -> None:
        """After the slots stopped: settle everything held, leave the group, disconnect."""
        self.stop_taking()
        fetch = self._tasks.get("fetch")
        if fetch is not None:
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError, Exception):
                await asyncio.wait_for(fetch, BLOCK_MS / 1000 + CONNECT_TIMEOUT_S)
        for held in list(self._held.values()):  # what the last fetch brought in
            self._settle_if_done(held)
        deadline = time.monotonic() + SHUTDOWN_WRITE_S
        while (self._settling or self._writing) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.vanish()
        await self._leave()
        await self.link.close()

    async def vanish(self) -> None:
        """Stop every loop at once, settling nothing (what ``close`` does last; tests use
        it alone to play a worker that died)."""
        self._closed = True
        self._taking = False
        self._write_wake.set()
        self._want_more.set()
        await stop_tasks(list(self._tasks.values()))

    async def _leave(self) -> None:
        if self._held:  # could not settle (Redis down): stay in the group, to be reclaimed
            log.error(
                "stopping with %d chunks unsettled; other workers take them over after %g s",
                len(self._held),
                self.settings.visibility_timeout_s,
            )
            return
        k = self.keys

        def fill(pipe: Pipeline) -> None:
            pipe.delete(k.worker(self.name), k.woke(self.name))
            pipe.srem(k.workers, self.name)
            pipe.xpending_range(k.jobs, GROUP, "-", "+", 1, consumername=self.name)

        with contextlib.suppress(QueueUnavailable, ResponseError):
            *_, pending = await self.link.pipeline(fill)
            # Leaving the group drops what it still lists as ours: only when that is nothing.
            if not pending:
                await self.link.call("xgroup_delconsumer", k.jobs, GROUP, self.name)
