"""Stateful sessions: a ``session_id`` keeps Python state across calls, notebook style.

How: the API node keeps, per session, the cells that ended ``ok`` (code, mode, stdin), the
files they were given and a random seed. A call runs one ordinary execution of the driver
(``cell_program``) that seeds ``random`` and numpy, replays those cells with their output
discarded, then runs the new cell. Why replay rather than a live interpreter per session:
executions stay what they are everywhere else (one confined fork, any slot, any worker node,
killed and cleaned at the end), nothing is held between calls but a few strings, a worker
crash loses nothing, and the cost is bounded by ``session_max_cells``. The seed makes a
replayed history draw the same random numbers it drew the first time.

What a session promises (a failed cell leaves no trace, calls on one session run in order, the
limits, the routing behind several API nodes) is written once, in docs/integrations.md. A
session also belongs to its tenant: another tenant naming the same ``session_id`` gets an
empty session of its own, and each tenant has a store of its own, of its key's
``max_sessions`` (``session_max`` without), least recently used forgotten first: a tenant
opening sessions by the thousand forgets only its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sandbox_service.cell_program import Cell, new_nonce, parse, program
from sandbox_service.models import (
    ErrorDetail,
    ExecuteRequest,
    ExecuteResult,
    Mode,
    RequestRejected,
    Status,
    merge_files,
)
from sandbox_service.queue.base import Queue, QueueFull, Submission
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT_TENANT


@dataclass
class Session:
    id: str
    seed: int
    used_at: float
    tenant: str = DEFAULT_TENANT
    cells: list[Cell] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)  # request ids whose cell was appended
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _nonce(session_id: str, request_id: str | None) -> str:
    # A resubmitted id gets the queue's stored result, so its markers must be the same ones.
    if request_id is None:
        return new_nonce()
    digest = hashlib.sha256(f"{session_id}\x00{request_id}".encode()).hexdigest()[:16]
    return f"\x00sbx-{digest}\x00"


class Sessions:
    """The session stores of one API node (one per tenant), and the submit path that uses them."""

    def __init__(self, settings: Settings, limit: Callable[[str], int] | None = None) -> None:
        """``limit``: the most sessions a tenant keeps (its key's ``max_sessions``); 0 or no
        ``limit``: ``session_max``."""
        self.ttl_s = settings.session_ttl_s
        self.max_cells = settings.session_max_cells
        self.max_sessions = settings.session_max
        self._limit = limit
        self._stores: dict[str, OrderedDict[str, Session]] = {}

    def __len__(self) -> int:
        self._expire(time.monotonic())
        return sum(len(store) for store in self._stores.values())

    def limit(self, tenant: str) -> int:
        return (self._limit(tenant) if self._limit else 0) or self.max_sessions

    def _expire(self, now: float) -> None:
        for tenant, store in list(self._stores.items()):
            while store:
                oldest = next(iter(store.values()))
                if oldest.used_at + self.ttl_s > now or oldest.lock.locked():
                    break
                store.popitem(last=False)
            if not store:
                del self._stores[tenant]

    def peek(self, session_id: str, tenant: str = DEFAULT_TENANT) -> Session | None:
        self._expire(time.monotonic())
        store = self._stores.get(tenant)
        return store.get(session_id) if store is not None else None

    def get(self, session_id: str, tenant: str = DEFAULT_TENANT) -> Session:
        """The session, created empty when unknown or forgotten; marks it used. Past the
        tenant's limit, that tenant's least recently used session is forgotten."""
        now = time.monotonic()
        self._expire(now)
        store = self._stores.setdefault(tenant, OrderedDict())
        session = store.get(session_id)
        if session is None:
            session = Session(session_id, secrets.randbits(32), now, tenant)
            store[session_id] = session
            limit = self.limit(tenant)
            while len(store) > limit:
                store.popitem(last=False)
        session.used_at = now
        store.move_to_end(session_id)
        return session

    def drop(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        store = self._stores.get(tenant)
        return store is not None and store.pop(session_id, None) is not None

    # ------------------------------------------------------------- submit

    def _check_room(self, requests: Sequence[ExecuteRequest], batch: bool, tenant: str) -> None:
        wanted: dict[str, int] = defaultdict(int)
        found = []
        for index, request in enumerate(requests):
            if request.session_id is None:
                continue
            wanted[request.session_id] += 1
            session = self.peek(request.session_id, tenant)
            held = len(session.cells) if session else 0
            if held + wanted[request.session_id] <= self.max_cells:
                continue
            loc: list[str | int] = ["body", "requests", index] if batch else ["body"]
            why = f"session {request.session_id!r} holds {held} cells, the most this server keeps"
            found.append(
                ErrorDetail(
                    loc=[*loc, "session_id"],
                    msg=f"{why} is {self.max_cells} (SANDBOX_SESSION_MAX_CELLS): start a new one",
                    type="too_long",
                    ctx={"limit": self.max_cells, "size": held},
                )
            )
        if found:
            raise RequestRejected(422, found)

    async def submit(
        self, queue: Queue, submission: Submission, batch: bool = True
    ) -> list[ExecuteResult]:
        """Run ``submission``'s requests; results in order. Those with a ``session_id`` go
        through their session, one at a time per session; the others are submitted first,
        together, so a full queue refuses the batch (429) before any session has changed."""
        requests, tenant = submission.requests, submission.tenant
        if all(r.session_id is None for r in requests):
            return await queue.run(submission)
        self._check_room(requests, batch, tenant.name)
        results: list[ExecuteResult | None] = [None] * len(requests)
        plain = [i for i, r in enumerate(requests) if r.session_id is None]
        if plain:
            answered = await queue.run(submission.part([requests[i] for i in plain]))
            for i, result in zip(plain, answered, strict=True):
                results[i] = result
        chains: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            if r.session_id is not None:
                chains[r.session_id].append(i)
        done = await asyncio.gather(
            *(
                self._chain(queue, submission.part([requests[i] for i in ix]), sid)
                for sid, ix in chains.items()
            )
        )
        for indices, chain_results in zip(chains.values(), done, strict=True):
            for i, result in zip(indices, chain_results, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    async def _chain(self, queue: Queue, chain: Submission, session_id: str) -> list[ExecuteResult]:
        """One session's requests, in order; once one is refused the rest are too (``rejected``:
        the client may resend them, and order is kept)."""
        session = self.get(session_id, chain.tenant.name)
        results: list[ExecuteResult] = []
        async with session.lock:
            for request in chain.requests:
                if results and results[-1].status is Status.rejected:
                    why = "an earlier cell of its session was refused; it did not run"
                    results.append(
                        ExecuteResult(id=request.id, status=Status.rejected, message=why)
                    )
                else:
                    results.append(await self._step(queue, chain, session, request))
        return results

    async def _step(
        self, queue: Queue, chain: Submission, session: Session, request: ExecuteRequest
    ) -> ExecuteResult:
        nonce = _nonce(session.id, request.id)
        driver = program(
            [Cell(request.code, request.mode.value, request.stdin)],
            nonce,
            replay=session.cells,
            seed=session.seed,
        )
        files = merge_files(session.files, request.files)
        update = {"code": driver.code, "stdin": driver.stdin, "mode": Mode.script, "files": files}
        wrapped = request.model_copy(update=update)
        try:
            [result] = await queue.run(chain.part([wrapped]))
        except QueueFull as exc:  # never ran: the client may send it again
            return ExecuteResult(id=request.id, status=Status.rejected, message=str(exc))
        driven = parse(result.stdout, result.stderr, nonce)
        if driven.replay_failed is not None:
            self.drop(session.id, session.tenant)
            failed = driven.replay_failed
            why = (
                f"session {session.id!r} could not be restored: its cell {failed['replay_failed']} "
                f"raised {failed['error']} when replayed (it depends on something that changed, "
                "like the clock or a file); the session was discarded"
            )
            update = {"status": Status.error, "stdout": "", "stderr": "", "message": why}
            return result.model_copy(update=update)
        if result.status is Status.ok and (request.id is None or request.id not in session.applied):
            session.cells.append(Cell(request.code, request.mode.value, request.stdin))
            session.files = files  # still merged from these: the session's lock is held
            if request.id is not None:
                session.applied.add(request.id)
        session.used_at = time.monotonic()
        return result.model_copy(update={"stdout": driven.stdout, "stderr": driven.stderr})
