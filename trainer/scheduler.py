"""Rollout drivers: rollouts run through turn placement and tool dispatch, or in rounds.

- :func:`run_async` drives each rollout at its own pace: a turn is generated on the engine
  ``placement.RolloutScheduler`` chooses, its tool calls go to ``tool_dispatch.ToolDispatcher``
  the moment it ends, and its next turn follows its results.
- :func:`run_in_rounds` is the synchronous baseline: every unfinished rollout generates a turn,
  then all calls of the round go out in one batch, then the next round.

Both return the time rollouts spent waiting for their tool results, summed over rollouts;
:class:`MeteredEngine` counts each engine's busy time, and :class:`DriverMeter` keeps both
for the step's metrics (``engine_idle_s``, ``tool_wait_s``).

A rollout is an :class:`Agent`: what to generate next, and what a finished turn and its tool
results do to it. ``rollout.py`` implements it on token ids and text; the simulation
(``trainer/sim``) on planned lengths. Both run the code here, under the real clock or a
simulated one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sandbox_service.models import ExecuteRequest, ExecuteResult
from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.futures import gather_all
from trainer.placement import KvCapacity, ReportsKvCapacity, RolloutScheduler, static_engine
from trainer.tool_dispatch import ToolDispatcher, ToolRunner

T = TypeVar("T")


class Agent(Protocol):
    """One rollout, as the drivers see it."""

    def next_request(self) -> GenerationRequest:
        """The next turn: the whole context so far and the tokens it may still generate."""
        ...

    def take_generation(self, generation: Generation) -> list[ExecuteRequest] | None:
        """Append a turn; the calls to execute (maybe none), or None if the rollout ended."""
        ...

    def take_results(self, results: list[ExecuteResult]) -> bool:
        """Append the tool turn (one result per call, in order); False if the rollout ended."""
        ...


async def run_async(
    agents: Sequence[Agent], scheduler: RolloutScheduler, tools: ToolDispatcher
) -> float:
    """Every agent to its end, each at its own pace: a turn is generated where the scheduler
    puts it, its calls go to the dispatcher at once, and its next turn follows its results.
    The time agents waited for tool results, summed."""
    loop = asyncio.get_running_loop()
    waited = [0.0]

    async def drive(index: int, agent: Agent) -> None:
        while True:
            generation = await scheduler.generate(index, agent.next_request())
            calls = agent.take_generation(generation)
            if calls is None:
                return
            sent = loop.time()
            results = await tools.run(calls)
            waited[0] += loop.time() - sent
            if not agent.take_results(results):
                return

    scheduler.expect(len(agents))
    try:
        await gather_all([drive(i, agent) for i, agent in enumerate(agents)])
    finally:
        await tools.aclose()
    return waited[0]


async def run_in_rounds(
    agents: Sequence[Agent],
    engines: Sequence[GenerationBackend],
    runner: ToolRunner,
    params: SamplingParams,
) -> float:
    """The synchronous baseline: each round, every unfinished agent generates one turn (on its
    static engine, one ``generate`` call per engine); then all calls of the round go to
    ``runner`` in one batch, and nobody starts the next turn before every result is back.
    The time agents waited for tool results, summed (each waits for the whole batch)."""
    loop = asyncio.get_running_loop()
    waited = 0.0
    active = list(range(len(agents)))
    while active:
        requests = {i: agents[i].next_request() for i in active}
        generations = await _generate_static(engines, requests, len(agents), params)
        pending = {}
        for i in active:
            calls = agents[i].take_generation(generations[i])
            if calls is not None:
                pending[i] = calls
        batch = [call for calls in pending.values() for call in calls]
        sent = loop.time()
        results = iter(await runner.run(batch) if batch else [])
        waited += (loop.time() - sent) * len(pending)
        active = [
            i for i, calls in pending.items() if agents[i].take_results(_take(results, calls))
        ]
    return waited


async def _generate_static(
    engines: Sequence[GenerationBackend],
    requests: dict[int, GenerationRequest],
    count: int,
    params: SamplingParams,
) -> dict[int, Generation]:
    """Agent i's request on its static engine (of ``count`` agents): one ``generate`` call per
    engine, all at once."""
    shares: list[list[int]] = [[] for _ in engines]
    for i in requests:
        shares[static_engine(i, count, engines)].append(i)
    used = [(engine, share) for engine, share in zip(engines, shares, strict=True) if share]
    answers = await gather_all(
        [engine.generate([requests[i] for i in s], params) for engine, s in used]
    )
    return {
        i: generation
        for (_, share), generations in zip(used, answers, strict=True)
        for i, generation in zip(share, generations, strict=True)
    }


def _take(results: Iterator[T], calls: Sequence[object]) -> list[T]:
    return [next(results) for _ in calls]


# ---------------------------------------------------------------------------- measurements


class MeteredEngine(GenerationBackend):
    """An engine whose busy time is counted: the time at least one request of ours ran on it.
    Build with :func:`metered` (it keeps the engine's KV report)."""

    def __init__(self, engine: GenerationBackend) -> None:
        self.engine = engine
        self.continuous_batching, self.per_rank = engine.continuous_batching, engine.per_rank
        self.busy_s = 0.0
        self._running, self._since = 0, 0.0

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        loop = asyncio.get_running_loop()
        if self._running == 0:
            self._since = loop.time()
        self._running += 1
        try:
            return await self.engine.generate(requests, params)
        finally:
            self._running -= 1
            if self._running == 0:
                self.busy_s += loop.time() - self._since


class _MeteredKvEngine(MeteredEngine):
    def kv_capacity(self) -> KvCapacity:
        assert isinstance(self.engine, ReportsKvCapacity)
        return self.engine.kv_capacity()


def metered(engine: GenerationBackend) -> MeteredEngine:
    kind = _MeteredKvEngine if isinstance(engine, ReportsKvCapacity) else MeteredEngine
    return kind(engine)


@dataclass
class DriverMeter:
    """What the drivers measured over a step's rollouts: wall time, each engine's busy time,
    and the time rollouts waited for tool results (summed over rollouts)."""

    wall_s: float = 0.0
    engine_busy_s: list[float] = field(default_factory=list)
    tool_wait_s: float = 0.0
    rollouts: int = 0

    def record(
        self, wall_s: float, engines: Sequence[MeteredEngine], tool_wait_s: float, rollouts: int
    ) -> None:
        self.wall_s += wall_s
        busy = [e.busy_s for e in engines]
        if len(self.engine_busy_s) < len(busy):
            self.engine_busy_s += [0.0] * (len(busy) - len(self.engine_busy_s))
        self.engine_busy_s = [a + b for a, b in zip(self.engine_busy_s, busy, strict=False)]
        self.tool_wait_s += tool_wait_s
        self.rollouts += rollouts

    @property
    def engine_idle_s(self) -> list[float]:
        """Per engine: the driver's wall time with nothing of ours running on it."""
        return [max(0.0, self.wall_s - busy) for busy in self.engine_busy_s]

    def metrics(self) -> dict[str, float]:
        idle = self.engine_idle_s
        mean_idle = sum(idle) / len(idle) if idle else 0.0
        return {
            "engines": float(len(idle)),
            "engine_idle_s": mean_idle,  # mean over engines
            "engine_idle_frac": mean_idle / self.wall_s if self.wall_s else 0.0,
            "tool_wait_s": self.tool_wait_s / self.rollouts if self.rollouts else 0.0,  # each
        }
