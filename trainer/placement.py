"""Rollout placement: which engine generates each turn, by free KV cache and prefix affinity.

*Static allocation* of N rollouts per engine (rStar2-Agent, section 4) leaves engines idle
behind another's long tail and overflows KV caches (the engine preempts and recomputes).
:class:`RolloutScheduler` assigns each turn of a rollout to an engine instead. ``balanced``
(ours): a request goes only where its context plus all it may still generate fits in the KV
cache the engine has left (its reported free blocks, less what the scheduler has promised there
already), so no engine is asked for more than it holds. Turns are generated in chunks, so what
is promised is a chunk, not the rollout's whole remaining budget. A rollout's next request
goes back to the engine holding its prefix; when that engine is full it waits for it up to
``locality_wait_s`` before moving, and it moves at once to an engine with nothing running.
Requests that fit nowhere wait, oldest rollout first (an engine a waiting request wants is
closed to younger ones, so none starves), and are placed as capacity frees. ``static``: N
rollouts per engine, fixed for the whole step (the batch dealt out in contiguous shards,
:func:`static_engine`), and each engine sorts out the rest itself.

What an engine reports is :class:`KvCapacity`, through :class:`ReportsKvCapacity` (a serving
engine such as vLLM implements it). An engine that reports nothing is taken to have no KV
limit (the transformers backend: its batches are bounded by ``max_batch`` instead). Time is
read only from the running event loop, so the simulation (``trainer/sim``) runs this code
under a simulated clock.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.futures import settle

Assignment = Literal["static", "balanced"]


# ---------------------------------------------------------------------------- what engines say


@dataclass(frozen=True)
class KvCapacity:
    """An engine's KV cache, as it reports it.

    ``free_blocks`` counts blocks no running request holds; blocks that only cache a finished
    request's prefix can be evicted, so they count as free (vLLM's block pool does the same).
    ``max_seqs`` is the most requests the engine runs at once (vLLM's ``max_num_seqs``).
    """

    block_size: int  # tokens per block
    total_blocks: int
    free_blocks: int
    max_seqs: int | None = None

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@runtime_checkable
class ReportsKvCapacity(Protocol):
    """The capacity interface: an engine that can say how much KV cache it has free now.

    ``kv_capacity()`` is called at placement decisions, so it must be cheap and must not block
    (vLLM: the block pool's free count, ``cache_config.block_size``, ``num_gpu_blocks``,
    ``scheduler_config.max_num_seqs``). The free blocks an engine reports while none of the
    scheduler's requests run on it are the scheduler's budget there until it is idle again,
    and it never promises more; so while it has requests on an engine, nothing else should
    take blocks from it. Such an engine batches continuously (``continuous_batching = True``)
    and should cache prefixes (vLLM's ``enable_prefix_caching``): a rollout's next turn and a
    turn's next chunk come back to it with the same prefix.
    """

    def kv_capacity(self) -> KvCapacity: ...


# ---------------------------------------------------------------------------- assignment policy


@dataclass(frozen=True)
class SchedulerSettings:
    """How turns are placed.

    ``assignment``: ``balanced`` or ``static`` (see the module docstring).

    ``chunk_tokens`` (``balanced``, on engines that report their KV cache): a turn is generated
    in chunks of at most this many new tokens, each its own request. What the scheduler holds
    for a request is its context plus all it may still generate, so a turn sent whole would
    hold the rollout's entire remaining budget (8K tokens, most of them never written) and few
    would fit at once. A chunk's continuation goes back to the engine whose prefix cache holds
    everything before it; sampling is token by token, so the chunks are the same turn. (Stop
    strings must be single tokens, as Qwen's ``</tool_call>`` is, not to be split between
    chunks.) None: whole turns.

    ``locality_wait_s``: how long a turn waits for the engine holding its prefix when that
    engine is full, before it may go to another one and have its context recomputed there.
    """

    assignment: Assignment = "balanced"
    chunk_tokens: int | None = 1024
    locality_wait_s: float = 2.0


@dataclass
class EngineLoad:
    """The scheduler's ledger of one engine: what it may use and what is promised on it."""

    usable_blocks: float  # math.inf: the engine reports no KV limit
    block_size: int = 1
    max_seqs: int | None = None
    reserved_blocks: int = 0
    running: int = 0

    @classmethod
    def of(cls, capacity: KvCapacity | None) -> EngineLoad:
        if capacity is None:
            return cls(math.inf)
        return cls(capacity.free_blocks, capacity.block_size, capacity.max_seqs)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def headroom_tokens(self) -> float:
        return (self.usable_blocks - self.reserved_blocks) * self.block_size

    def fits(self, tokens: int) -> bool:
        seats = self.max_seqs is None or self.running < self.max_seqs
        return seats and self.blocks_for(tokens) <= self.usable_blocks - self.reserved_blocks


def choose_engine(
    loads: Sequence[EngineLoad],
    tokens: int,
    home: int | None,
    allowed: Collection[int] | None = None,
    patient: bool = False,
) -> int | None:
    """The engine for a request of at most ``tokens`` tokens (context + new) among ``allowed``
    (default: all), or None: it should wait.

    A rollout's first request goes where there is the most room left (then the fewest
    running, the lowest index). Later ones go back to ``home``, the engine holding the
    prefix, if it has room; but to an engine with nothing running if home has other work:
    recomputing the prefix there costs only an idle engine's time, and the rollout then runs
    on an engine of its own. A ``patient`` request whose home is full waits for it; an
    impatient one goes where there is the most room.
    """
    fitting = [
        i for i, load in enumerate(loads) if (allowed is None or i in allowed) and load.fits(tokens)
    ]

    def roomiest(candidates: list[int]) -> int:
        return max(candidates, key=lambda i: (loads[i].headroom_tokens(), -loads[i].running, -i))

    if not fitting:
        return None
    if home is None:
        return roomiest(fitting)
    idle = [i for i in fitting if loads[i].running == 0]
    if idle and loads[home].running > 0:
        return roomiest(idle)
    if home in fitting:
        return home
    return None if patient else roomiest(fitting)


def static_engine(index: int, count: int, engines: Sequence[object]) -> int:
    """Static N-per-engine: rollout ``index`` of ``count`` on engine ``index * E // count``.
    Contiguous shards, as a trainer that splits its batch over engines deals it out (verl's
    ``DataProto.chunk``), so a prompt's group of rollouts shares an engine."""
    return index * len(engines) // max(count, index + 1)  # count: at least index + 1


@dataclass(order=True)
class _Ticket:
    """A request waiting for an engine; ordered by its rollout's arrival, then submission."""

    rank: int
    seq: int
    rollout: Hashable = field(compare=False)
    tokens: int = field(compare=False)
    assigned: asyncio.Future[int] = field(compare=False)
    since: float = field(compare=False)
    engine: int | None = field(default=None, compare=False)
    blocks: int = field(default=0, compare=False)
    alarm: bool = field(default=False, compare=False)  # a pump is set for its locality wait


@dataclass
class SchedulerStats:
    requests: int = 0  # turns, or chunks of turns
    continued: int = 0  # chunks that continued a turn
    affinity_kept: int = 0  # requests that went back to the engine holding their prefix
    moved: int = 0  # requests that left their home: full past the wait, or an engine was idle
    waits: int = 0  # requests that could not be placed at once
    wait_s: float = 0.0  # their total time waiting for an engine
    per_engine: list[int] = field(default_factory=list)


class RolloutScheduler:
    """Assigns turns to engines and runs them there (``SchedulerSettings``).

    ``generate(rollout, request)`` returns when the turn is generated. A rollout is any
    hashable key; its first request fixes its place in the queue (older rollouts first), and
    its later requests prefer the engine that served its previous one.
    """

    def __init__(
        self,
        engines: Sequence[GenerationBackend],
        params: SamplingParams,
        settings: SchedulerSettings | None = None,
    ) -> None:
        if not engines:
            raise ValueError("RolloutScheduler needs at least one engine")
        self.engines, self.params = list(engines), params
        self.settings = settings or SchedulerSettings()
        self.loads = [EngineLoad.of(self._report(e)) for e in self.engines]
        reported = all(isinstance(e, ReportsKvCapacity) for e in self.engines)
        balanced = self.settings.assignment == "balanced"
        self.chunk_tokens = self.settings.chunk_tokens if balanced and reported else None
        self.stats = SchedulerStats(per_engine=[0] * len(self.engines))
        self._workers = [_EngineWorker(e, params) for e in self.engines]
        self._waiting: list[_Ticket] = []  # sorted
        self._rank: dict[Hashable, int] = {}
        self._home: dict[Hashable, int] = {}
        self._seq = itertools.count()
        self._expected: int | None = None

    def expect(self, rollouts: int) -> None:
        """Say how many rollouts the step has (``static`` deals them out in shards)."""
        self._expected = rollouts

    async def generate(self, rollout: Hashable, request: GenerationRequest) -> Generation:
        """The turn of ``rollout`` that ``request`` asks for, in chunks if so configured."""
        chunk = self.chunk_tokens or request.max_new_tokens
        tokens: list[int] = []
        logprobs: list[float] = []
        while True:
            left = request.max_new_tokens - len(tokens)
            piece = await self._run(rollout, _continued(request, tokens, min(chunk, left)))
            tokens += piece.token_ids
            logprobs += piece.logprobs
            if piece.finish_reason != "length" or len(tokens) >= request.max_new_tokens:
                return Generation(tokens, logprobs, piece.finish_reason)
            if not piece.token_ids:  # the engine cannot go on (its context limit)
                return Generation(tokens, logprobs, "length")
            self.stats.continued += 1

    async def _run(self, rollout: Hashable, request: GenerationRequest) -> Generation:
        ticket = self._submit(rollout, request)
        try:
            engine = await ticket.assigned
        except asyncio.CancelledError:
            if ticket.engine is not None:  # assigned just as the wait was cancelled
                self._release(ticket)
            raise
        try:
            return await self._workers[engine].generate(request)
        finally:
            self._release(ticket)

    # -- the ledger

    def _submit(self, rollout: Hashable, request: GenerationRequest) -> _Ticket:
        loop = asyncio.get_running_loop()
        tokens = len(request.prompt_ids) + request.max_new_tokens
        rank = self._rank.setdefault(rollout, len(self._rank))
        ticket = _Ticket(rank, next(self._seq), rollout, tokens, loop.create_future(), loop.time())
        self.stats.requests += 1
        if self.settings.assignment == "static":
            if self._expected is None:  # not told the step's size: deal them out in turn
                self._assign(ticket, rank % len(self.engines))
            else:
                self._assign(ticket, static_engine(rank, self._expected, self.engines))
            return ticket
        if not any(self._could_ever_fit(i, tokens) for i in range(len(self.engines))):
            raise ValueError(
                f"a request of {tokens} tokens fits in no engine's KV cache "
                f"({[self._report(e) for e in self.engines]})"
            )
        bisect.insort(self._waiting, ticket)
        self._pump()
        if not ticket.assigned.done():
            self.stats.waits += 1
        return ticket

    def _could_ever_fit(self, engine: int, tokens: int) -> bool:
        report = self._report(self.engines[engine])
        return report is None or report.blocks_for(tokens) <= report.total_blocks

    def _pump(self) -> None:
        """Place waiting requests, oldest rollout first.

        A request goes to its home engine if that has room. If not, it waits for it, up to
        ``locality_wait_s``; then (or at once, if it has no home) it goes wherever there is the
        most room. An engine that a waiting request wants is closed to younger ones, so room
        that frees there goes to the oldest first and no request waits forever.
        """
        if not self._waiting:
            return
        self._recalibrate_idle()
        loop = asyncio.get_running_loop()
        everywhere = frozenset(range(len(self.engines)))
        closed: set[int] = set()
        still: list[_Ticket] = []
        for at, ticket in enumerate(self._waiting):
            if len(closed) == len(everywhere):
                still += self._waiting[at:]
                break
            if ticket.assigned.cancelled():
                continue
            home = self._home.get(ticket.rollout)
            patience = ticket.since + self.settings.locality_wait_s - loop.time()
            patient = home is not None and patience > 0
            engine = choose_engine(self.loads, ticket.tokens, home, everywhere - closed, patient)
            if engine is not None:
                self._assign(ticket, engine)
                continue
            still.append(ticket)
            if home is None or not patient:
                closed |= everywhere
                continue
            closed.add(home)
            if not ticket.alarm:
                ticket.alarm = True
                loop.call_later(patience, self._pump)
        self._waiting = still

    def _recalibrate_idle(self) -> None:
        """An engine with nothing of ours on it reports what it can give us: its free blocks
        then are the budget for what we promise it until it is idle again."""
        for i, engine in enumerate(self.engines):
            report = self._report(engine)
            if report is not None and self.loads[i].running == 0:
                self.loads[i] = EngineLoad.of(report)

    def _assign(self, ticket: _Ticket, engine: int) -> None:
        load, home = self.loads[engine], self._home.get(ticket.rollout)
        ticket.engine, ticket.blocks = engine, load.blocks_for(ticket.tokens)
        load.reserved_blocks += ticket.blocks
        load.running += 1
        self.stats.per_engine[engine] += 1
        if home is not None:
            self.stats.affinity_kept += home == engine
            self.stats.moved += home != engine
        self._home[ticket.rollout] = engine
        self.stats.wait_s += asyncio.get_running_loop().time() - ticket.since
        ticket.assigned.set_result(engine)

    def _release(self, ticket: _Ticket) -> None:
        if ticket.engine is None:
            return
        load = self.loads[ticket.engine]
        load.reserved_blocks -= ticket.blocks
        load.running -= 1
        ticket.engine = None
        self._pump()

    @staticmethod
    def _report(engine: GenerationBackend) -> KvCapacity | None:
        return engine.kv_capacity() if isinstance(engine, ReportsKvCapacity) else None


@runtime_checkable
class Extensible(Protocol):
    """A prompt that is not a list of token ids (the simulation's) says how it grows."""

    def extended(self, generated: Sequence[int]) -> Sequence[int]: ...


def _continued(
    request: GenerationRequest, generated: list[int], max_new_tokens: int
) -> GenerationRequest:
    """The request for the next chunk of a turn: its prompt and what the turn has written."""
    prompt = request.prompt_ids
    if generated:
        prompt = (
            prompt.extended(generated) if isinstance(prompt, Extensible) else [*prompt, *generated]
        )
    return GenerationRequest(prompt, max_new_tokens)


class _EngineWorker:
    """Sends an engine its requests. A continuously batching engine (vLLM) takes each request
    as it comes; any other gets one ``generate`` call at a time, of every request queued
    while the previous call ran."""

    def __init__(self, backend: GenerationBackend, params: SamplingParams) -> None:
        self.backend, self.params = backend, params
        self._queue: list[tuple[GenerationRequest, asyncio.Future[Generation]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.backend.continuous_batching:
            [generation] = await self.backend.generate([request], self.params)
            return generation
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._run_batches())
        return await future

    async def _run_batches(self) -> None:
        await asyncio.sleep(0)  # let every turn that ends at this instant join the batch
        while self._queue:
            batch, self._queue = self._queue, []
            requests = [request for request, _ in batch]
            await settle([f for _, f in batch], self.backend.generate(requests, self.params))


# ---------------------------------------------------------------------------- tool calls
