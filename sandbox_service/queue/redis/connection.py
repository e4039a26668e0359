"""The connection to Redis and the wire format, shared by API nodes and worker nodes.

``RedisLink`` counts round trips (the figure the benchmark prints), runs the Lua scripts of
``queue.redis.scripts`` by SHA (loading them again after a Redis restart), and turns an unreachable
Redis into ``QueueUnavailable``. A job travels as JSON (``WireJob``); a chunk is a JSON list
of jobs; ``Settlement`` is one call of the settle script.

With ``redis_sentinels`` set, the primary is asked of the Sentinels on every new connection,
so a node follows a failover on its own; a primary that turned replica (``READONLY``) is a
dropped connection, never a write to a replica. Every write also raises this link's own mark
(``Keys.mark``): a mark that comes back lower than one already seen means Redis lost writes
it had acknowledged (a failover to a replica that lagged), and ``on_loss`` is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import Counter
from pydantic import BaseModel, TypeAdapter
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.maint_notifications import MaintNotificationsConfig

from sandbox_service.metrics import Metrics
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import Job, QueueUnavailable, scoped
from sandbox_service.queue.redis.keys import GROUP, Keys
from sandbox_service.queue.redis.scripts import SCRIPTS, Script
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT_TENANT

CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 10.0  # above BLOCK_MS, below anything a client would wait for
MAX_CONNECTIONS = 64  # per node; blocking reads hold one each
BLOCK_MS = 1000  # blocking reads return this often, so loops notice shutdown
REPLY_MAXLEN = 100_000  # a reply stream nobody reads any more stays bounded
BACKOFF_S = (0.05, 0.1, 0.25, 0.5, 1.0)
NOT_CACHED = (Status.rejected, Status.internal_error)  # as the in-process queue
MARK_TTL_S = 3600  # a node's mark outlives any pause of it; a stopped node's goes away
MARK_WINDOW = 4 * MAX_CONNECTIONS  # replies of concurrent calls come back at most this disordered
FOLLOW_S = 1.0  # with Sentinels, how often a node checks it still talks to their primary
DEMOTED = ("READONLY", "UNBLOCKED")  # a primary that became a replica says so with these

log = logging.getLogger(__name__)


def redacted(url: str) -> str:
    """The URL without its password, fit for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def read_secret(path: str, setting: str) -> str:
    """The first line of a file (a mounted Secret)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except OSError as exc:  # a start-up error (the CLI prints it and exits 1)
        raise OSError(f"cannot read {setting}: {exc}") from None


def tls_options(settings: Settings) -> dict[str, Any]:
    """For ``rediss://``: the CA and client certificate to use."""
    options: dict[str, Any] = {}
    if settings.redis_url.startswith("rediss://"):
        for name, setting in (("ssl_ca_certs", settings.redis_tls_ca_file),
                              ("ssl_certfile", settings.redis_tls_cert_file),
                              ("ssl_keyfile", settings.redis_tls_key_file)):  # fmt: skip
            if setting:
                options[name] = setting
    return options


def credentials(settings: Settings) -> dict[str, Any]:
    """Connection options beyond the URL: an ACL user, a password read from a file (a mounted
    Secret: its first line), and for ``rediss://`` the CA and client certificate to use."""
    options: dict[str, Any] = tls_options(settings)
    if settings.redis_username:
        options["username"] = settings.redis_username
    if settings.redis_password_file:
        options["password"] = read_secret(settings.redis_password_file, "redis_password_file")
    return options


class SentinelBlockingPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A pool that asks the Sentinels for the primary on every new connection, bounded as the
    plain one: a burst of requests waits for a connection instead of opening thousands."""


def connect(settings: Settings) -> aioredis.Redis:
    """The client of a node: to ``redis_url``, or to the primary the Sentinels name."""
    common: dict[str, Any] = dict(
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),  # once, at once: a pooled connection may be stale
        maint_notifications_config=MaintNotificationsConfig(enabled=False),  # Redis 7 OSS
    )
    bounds: dict[str, Any] = {"max_connections": MAX_CONNECTIONS, "timeout": SOCKET_TIMEOUT_S}
    if not settings.redis_sentinels:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.redis_url, **credentials(settings), **bounds, **common
        )
        return aioredis.Redis.from_pool(pool)
    # The URL's scheme, credentials and database serve the primary; its host is not used.
    options = {**parse_url(settings.redis_url), **credentials(settings)}
    tls = options.pop("connection_class", None) is not None
    options.pop("host", None)
    options.pop("port", None)
    sentinel_options: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": CONNECT_TIMEOUT_S,
        **({"ssl": True, **tls_options(settings)} if tls else {}),
    }
    if settings.redis_sentinel_password_file:
        sentinel_options["password"] = read_secret(
            settings.redis_sentinel_password_file, "redis_sentinel_password_file"
        )
    sentinels = [
        (host, int(port)) for host, _, port in (a.rpartition(":") for a in settings.redis_sentinels)
    ]
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_options)
    client: aioredis.Redis = sentinel.master_for(
        settings.redis_sentinel_master,
        connection_pool_class=SentinelBlockingPool,
        ssl=tls,
        **options,
        **bounds,
        **common,
    )
    return client


def demoted(exc: BaseException) -> bool:
    """Did a primary that became a replica refuse a write (or end a blocking read)?"""
    return isinstance(exc, ReadOnlyError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(DEMOTED)
    )


def backoff(attempt: int) -> float:
    return BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]


def loop_failed(where: str, exc: Exception, level: int = logging.DEBUG) -> None:
    """Log why one turn of a background loop failed. The loops catch every exception: one
    that dies silently stops answering (or taking, or settling) while the node looks alive,
    and requests wait until their clients give up. A Redis outage is expected (``level``);
    anything else is a bug, logged with its traceback, and the loop goes on."""
    if isinstance(exc, (QueueUnavailable, ResponseError)):
        log.log(level, "%s: %s", where, exc)
    else:
        log.error("%s: unexpected %s; carrying on", where, type(exc).__name__, exc_info=exc)


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end. Their loops also check a flag of their
    own, because on Python 3.11 a cancellation that lands just as redis-py finishes a send
    is swallowed (``asyncio.wait_for``, gh-86296): cancelling again, after the loop's next
    turn, makes sure."""
    for _ in range(5):
        pending = [task for task in tasks if not task.done()]
        if not pending:
            break
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=BLOCK_MS / 1000 + 1)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("%s ended with %r", task.get_name(), task.exception())


# ---------------------------------------------------------------- the wire


class WireJob(BaseModel):
    key: str
    request: ExecuteRequest
    enqueued_at: float
    start_by: float
    attempts: int = 0
    tenant: str = DEFAULT_TENANT


WIRE_JOBS = TypeAdapter(list[WireJob])


def encode_job(job: Job) -> str:
    request = job.request.model_dump_json(exclude_defaults=True)
    return (
        f'{{"key":{json.dumps(job.key)},"enqueued_at":{job.enqueued_at!r},'
        f'"start_by":{job.start_by!r},"attempts":{job.attempts},'
        f'"tenant":{json.dumps(job.tenant)},"request":{request}}}'
    )


def encode_jobs(jobs: Sequence[Job]) -> str:
    return "[" + ",".join(encode_job(j) for j in jobs) + "]"


def decode_jobs(body: bytes) -> list[Job]:
    return [
        Job(w.request, w.enqueued_at, w.start_by, attempts=w.attempts, key=w.key, tenant=w.tenant)
        for w in WIRE_JOBS.validate_json(body)
    ]


@dataclass
class Settlement:
    """What ``settle`` does to one chunk: answer some jobs, put the others back."""

    chunk_id: bytes | str
    reply: str
    n: int  # jobs in the chunk, answered or not
    results: list[tuple[Job, ExecuteResult]]
    requeue: list[list[Job]] = field(default_factory=list)
    only_if_undelivered: bool = False
    reclaimed: int = 0
    tenant: str = DEFAULT_TENANT
    held: bool = True  # a worker took it (from the API node: False)
    estimate: float = 0.0  # what take charged its tenant
    took: float = 0.0  # slot-seconds its jobs used
    ran: int = 0  # how many of them ran

    def call(self, keys: Keys, result_ttl_s: float) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the settle script."""
        names = [keys.jobs, keys.depth, self.reply, keys.fair, keys.active, keys.bell,
                 keys.ready(self.tenant)]  # fmt: skip
        args: list[Any] = [
            GROUP,
            self.chunk_id,
            self.n,
            int(self.only_if_undelivered),
            REPLY_MAXLEN,
            int(result_ttl_s * 1000),
            self.tenant,
            int(self.held),
            repr(self.estimate),
            repr(self.took),
            self.ran,
            len(self.results),
        ]
        for job, result in self.results:
            rid, slot = job.request.id, 0
            if rid is not None:
                names.extend(keys.of_id(scoped(job.tenant, rid)))
                slot = (len(names) - 7) // 3
            cache = rid is not None and result_ttl_s > 0 and result.status not in NOT_CACHED
            args += [job.key, slot, int(cache), result.model_dump_json()]
        args.append(len(self.requeue))
        for jobs in self.requeue:
            args += [len(jobs), encode_jobs(jobs)]
        return names, args


# ---------------------------------------------------------------- the connection


@dataclass
class ScriptCall:
    """A script call waiting for ``RedisLink``'s next round trip."""

    script: Script
    keys: list[str]
    args: list[Any]
    done: asyncio.Future[Any]

    @property
    def call(self) -> tuple[Script, list[str], list[Any]]:
        return self.script, self.keys, self.args


class RedisLink:
    """One node's connection to Redis: counts round trips, runs the scripts, turns an
    unreachable Redis into ``QueueUnavailable`` and notices writes Redis lost (``on_loss``).
    Reconnection is redis-py's: a broken connection is replaced on the next command."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.where = redacted(settings.redis_url)
        if settings.redis_sentinels:
            self.where = (
                f"{settings.redis_sentinel_master} (Sentinels {','.join(settings.redis_sentinels)})"
            )
        self.keys = Keys(settings.redis_prefix)
        self.client = connect(settings)
        self.round_trips = 0
        self._round_trips = Counter(
            "sandbox_redis_round_trips_total",
            "Round trips to Redis (a pipeline or a script call is one)",
            registry=metrics.registry,
        )
        self.lost_writes = Counter(
            "sandbox_redis_lost_writes_total",
            "Times Redis was found to have lost writes it had acknowledged to this node "
            "(a failover to a replica that lagged)",
            registry=metrics.registry,
        )
        self.reachable = False
        self.problem = ""  # why the last command failed, for /readyz
        self.epoch: bytes | None = None
        self.mark = self.keys.mark(secrets.token_hex(6))
        self.on_loss: Callable[[], None] = lambda: None
        self._marks_seen: set[int] = set()
        self._mark_high = 0
        self._next_follow = 0.0
        self._calls: list[ScriptCall] = []
        self._sender: asyncio.Task[None] | None = None

    def _count(self) -> None:
        self.round_trips += 1
        self._round_trips.inc()

    def unavailable(self, exc: BaseException) -> QueueUnavailable:
        self.reachable = False
        if isinstance(exc, AuthenticationError) or "authenticat" in str(exc).lower():
            self.problem = (
                f"Redis at {self.where} refused this node's credentials ({exc}); check "
                "redis_url, redis_username and redis_password_file"
            )
        else:
            self.problem = f"the queue is unreachable (Redis at {self.where}: {exc}); retry later"
        return QueueUnavailable(self.problem)

    async def _demoted(self, exc: BaseException) -> QueueUnavailable:
        """The server we write to is a replica now: drop every connection to it (the next
        ones ask the Sentinels, or DNS, again), and count it an outage."""
        with contextlib.suppress(RedisError, OSError):
            await self.client.connection_pool.disconnect()
        return self.unavailable(exc)

    async def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        """One command. Redis's own refusals (ResponseError) pass through unchanged."""
        self._count()
        try:
            result = await getattr(self.client, command)(*args, **kwargs)
        except ResponseError as exc:
            if demoted(exc):
                raise await self._demoted(exc) from exc
            self.reachable = True
            raise
        except (RedisError, OSError) as exc:
            raise self.unavailable(exc) from exc
        self.reachable = True
        return result

    async def script(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """One script call, in one round trip shared with every call made while the last was
        out (a group commit: 64 single requests sent at once cost a few admission round trips
        between them, not 64; a lone call waits for nothing)."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls.append(ScriptCall(script, keys, args, done))
        sender = self._sender
        if sender is None or sender.done() or sender.get_loop() is not done.get_loop():
            self._sender = asyncio.create_task(self._send_calls(), name="redis-scripts")
        return await done

    async def _send_calls(self) -> None:
        """Send what ``script`` queued, one pipeline at a time, until nothing is queued."""
        batch: list[ScriptCall] = []
        try:
            while self._calls:
                batch, self._calls = self._calls, []
                try:
                    results = await self.pipeline(partial(self._add_calls, batch), each=True)
                except Exception as exc:  # the round trip failed, so did every call in it
                    results = [exc] * len(batch)
                for call, result in zip(batch, results, strict=True):
                    if call.done.done():  # its caller was cancelled
                        continue
                    if isinstance(result, Exception):
                        call.done.set_exception(result)
                    else:
                        call.done.set_result(result)
                batch = []
        finally:  # cancelled (the link closing): nobody is left waiting
            for call in [*batch, *self._calls]:
                if not call.done.done():
                    call.done.set_exception(QueueUnavailable("this node's Redis link closed"))
            self._calls = []

    @classmethod
    def _add_calls(cls, calls: list[ScriptCall], pipe: Pipeline) -> None:
        for call in calls:
            cls.add_script(pipe, *call.call)

    @staticmethod
    def add_script(pipe: Pipeline, script: Script, keys: list[str], args: list[Any]) -> None:
        pipe.evalsha(script.sha, len(keys), *keys, *args)

    async def load_scripts(self) -> None:
        for script in SCRIPTS:
            await self.call("script_load", script.source)

    async def pipeline(self, fill: Callable[[Pipeline], object], each: bool = False) -> list[Any]:
        """Commands queued by ``fill``, then this link's mark, sent in one round trip (not a
        transaction); the results of ``fill``'s commands (``each``: a command's error in its
        place, else the first one raised). Run again once if a script was missing: every
        command we pipeline may safely run twice."""
        await self.follow()
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            fill(pipe)
            pipe.incr(self.mark)
            pipe.expire(self.mark, MARK_TTL_S)
            self._count()
            try:
                *results, mark, _ = await pipe.execute(raise_on_error=False)
            except (RedisError, OSError) as exc:
                raise self.unavailable(exc) from exc
            refused = [r for r in (*results, mark) if isinstance(r, Exception) and demoted(r)]
            if refused:
                raise await self._demoted(refused[0])
            self.reachable = True
            if isinstance(mark, int):
                self._check_mark(mark)
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                await self.load_scripts()
                continue
            for r in results:
                if isinstance(r, Exception) and not each:
                    raise r
            return results
        raise AssertionError("unreachable")

    async def follow(self) -> None:
        """With Sentinels, at most every ``FOLLOW_S``: close the connections to a server they
        no longer name primary. A primary that was cut off and came back still says it is one
        until they demote it (seconds later): new connections go to the new primary, but open
        ones would go on writing to the old one, and all of that would be lost."""
        pool = self.client.connection_pool
        if not isinstance(pool, SentinelConnectionPool) or time.monotonic() < self._next_follow:
            return
        self._next_follow = time.monotonic() + FOLLOW_S
        try:
            primary = await pool.get_master_address()  # type: ignore[no-untyped-call]
        except (RedisError, OSError):
            return  # no Sentinel answers: the commands themselves will say so
        connections = [*getattr(pool, "_available_connections", ()),
                       *getattr(pool, "_in_use_connections", ())]  # fmt: skip
        for connection in connections:
            if connection.is_connected and (connection.host, connection.port) != primary:
                log.warning("closing a connection to %s:%s, no longer the primary",
                            connection.host, connection.port)  # fmt: skip
                with contextlib.suppress(RedisError, OSError):
                    await connection.disconnect()

    def _check_mark(self, value: int) -> None:
        """Every call returns a mark never returned before, unless Redis lost writes: one
        already seen, or one below those still in flight, says it did. Calls in flight
        together may come back in any order, hence the window instead of a plain maximum."""
        if value in self._marks_seen or value <= self._mark_high - MARK_WINDOW:
            self.lost_writes.inc()
            log.warning(
                "Redis at %s lost writes it had acknowledged (a failover to a replica that "
                "lagged?): checking what this node is waiting for",
                self.where,
            )
            self._marks_seen.clear()
            self._mark_high = value
            self._marks_seen.add(value)
            self.on_loss()
            return
        self._marks_seen.add(value)
        if value > self._mark_high:
            self._mark_high = value
            if len(self._marks_seen) > 2 * MARK_WINDOW:
                floor = value - MARK_WINDOW
                self._marks_seen = {v for v in self._marks_seen if v > floor}

    @staticmethod
    def epoch_offer() -> bytes:
        """A new epoch value, offered in case Redis has none. Fresh on every offer: a value
        per node would come back the same when that node is the first to reach Redis after
        each of two restarts, and the other nodes would not notice the second."""
        return secrets.token_hex(8).encode()

    def add_epoch(self, pipe: Pipeline) -> bytes:
        """Queue ``SET epoch offer NX GET``; returns the offer."""
        offer = self.epoch_offer()
        pipe.set(self.keys.epoch, offer, nx=True, get=True)
        return offer

    def epoch_changed(self, previous: bytes | None, offer: bytes) -> bool:
        """Given the epoch Redis had before a call that offered ``offer`` (None: it had none,
        and took the offer): did Redis lose its data since we last looked? Calls may come
        back out of order; the one whose offer we already hold is no news."""
        current = previous if previous is not None else offer
        changed = self.epoch is not None and current != self.epoch
        self.epoch = current
        return changed

    async def close(self) -> None:
        if self._sender is not None:
            await stop_tasks([self._sender])
        with contextlib.suppress(RedisError, OSError):
            await self.client.aclose()
        sentinels = getattr(self.client.connection_pool, "sentinel_manager", None)
        if sentinels is not None:
            with contextlib.suppress(RedisError, OSError):
                await sentinels.aclose()
