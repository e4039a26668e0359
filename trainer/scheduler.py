"""Rollout drivers: rollouts run through turn placement and tool dispatch, or in rounds.

- :func:`run_async` drives each rollout at its own pace: a turn is generated on the engine
  ``placement.RolloutScheduler`` chooses, its tool calls go to ``tool_dispatch.ToolDispatcher``
  the moment it ends, and its next turn follows its results.
- :func:`run_in_rounds` is the synchronous baseline: every unfinished rollout generates a turn,
  then all calls of the round go out in one batch, then the next round.

A rollout is an :class:`Agent`: what to generate next, and what a finished turn and its tool
results do to it. ``rollout.py`` implements it on token ids and text; the simulation
(``trainer/sim``) on planned lengths. Both run the code here, under the real clock or a
simulated one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

from sandbox_service.models import ExecuteRequest, ExecuteResult
from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.futures import gather_all
from trainer.placement import RolloutScheduler, static_engine
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
) -> None:
    """Every agent to its end, each at its own pace: a turn is generated where the scheduler
    puts it, its calls go to the dispatcher at once, and its next turn follows its results."""

    async def drive(index: int, agent: Agent) -> None:
        while True:
            generation = await scheduler.generate(index, agent.next_request())
            calls = agent.take_generation(generation)
            if calls is None:
                return
            if not agent.take_results(await tools.run(calls)):
                return

    scheduler.expect(len(agents))
    try:
        await gather_all([drive(i, agent) for i, agent in enumerate(agents)])
    finally:
        await tools.aclose()


async def run_in_rounds(
    agents: Sequence[Agent],
    engines: Sequence[GenerationBackend],
    runner: ToolRunner,
    params: SamplingParams,
) -> None:
    """The synchronous baseline: each round, every unfinished agent generates one turn (on its
    static engine, one ``generate`` call per engine); then all calls of the round go to
    ``runner`` in one batch, and nobody starts the next turn before every result is back."""
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
        results = iter(await runner.run(batch) if batch else [])
        active = [
            i for i, calls in pending.items() if agents[i].take_results(_take(results, calls))
        ]


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
