"""What the simulated rollouts do: long-tailed turn lengths and turn counts, tool-response
lengths, and tool latencies drawn from a distribution measured on the real service.

Every rollout's whole course is drawn up front from the seed (:func:`plans`), so each policy
of a comparison runs exactly the same rollouts and the same tool calls with the same
latencies; only where and when things run differs. :class:`SimRollout` plays a plan as a
scheduler :class:`~trainer.scheduler.Agent`, with the rollout loop's rules for budgets
(``max_response_tokens`` counts model and tool tokens; a tool turn that does not fit ends the
rollout); :class:`SimToolService` is the sandbox service with a number of slots.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from trainer.backends.base import Generation, GenerationRequest
from trainer.sim.engine import PlannedContext
from trainer.sim.record import DATA


@dataclass(frozen=True)
class LogNormal:
    """exp(N(log median, sigma^2)): the median, and a right tail that sigma stretches."""

    median: float
    sigma: float

    def sample(self, rng: random.Random) -> float:
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def draw(self, rng: random.Random, scale: float = 1.0) -> int:
        """A token count: a sample times ``scale``, rounded, at least 1."""
        return max(1, round(self.sample(rng) * scale))


@dataclass(frozen=True)
class Workload:
    """One RL step's rollouts: ``rollouts / group_size`` prompts, each sampled ``group_size``
    times (consecutive, as GRPO batches them). A prompt's ``difficulty`` scales the length of
    its rollouts' turns and their expected number of tool calls, so a group's rollouts are
    long or short together. Tool calls per rollout are geometric (mean ``tool_calls_mean``
    times the difficulty, at most ``max_turns`` - 1); each turn writes ``turn_tokens`` times
    the difficulty; each call's response is ``response_tokens`` long."""

    rollouts: int = 1024
    group_size: int = 32
    max_response_tokens: int = 8192
    max_turns: int = 10
    prompt_tokens: LogNormal = LogNormal(300, 0.3)
    difficulty: LogNormal = LogNormal(1.0, 0.5)
    turn_tokens: LogNormal = LogNormal(300, 1.0)
    tool_calls_mean: float = 2.5
    response_tokens: LogNormal = LogNormal(60, 0.8)


@dataclass(frozen=True)
class Plan:
    """A rollout's course: model tokens of each turn; response tokens and latency of the tool
    call after each turn but the last."""

    prompt: int
    turns: tuple[int, ...]
    responses: tuple[int, ...]
    latencies: tuple[float, ...]


def measured_latencies(path: Path = DATA) -> list[float]:
    """The round-trip seconds of the recorded tool calls (``python -m trainer.sim.record``)."""
    return [float(s["latency_s"]) for s in json.loads(path.read_text())["samples"]]


def plans(workload: Workload, latencies: Sequence[float], seed: int) -> list[Plan]:
    rng = random.Random(seed)
    out: list[Plan] = []
    while len(out) < workload.rollouts:
        prompt = workload.prompt_tokens.draw(rng)
        difficulty = workload.difficulty.sample(rng)
        # Geometric number of calls: P(k) = keep * (1 - keep)^k has mean (1 - keep) / keep.
        keep = 1 / (1 + workload.tool_calls_mean * difficulty)
        for _ in range(min(workload.group_size, workload.rollouts - len(out))):
            calls = int(math.log(1.0 - rng.random()) / math.log(1 - keep))
            calls = min(calls, workload.max_turns - 1)
            out.append(
                Plan(
                    prompt=prompt,
                    turns=tuple(
                        workload.turn_tokens.draw(rng, difficulty) for _ in range(calls + 1)
                    ),
                    responses=tuple(workload.response_tokens.draw(rng) for _ in range(calls)),
                    latencies=tuple(rng.choice(latencies) for _ in range(calls)),
                )
            )
    return out


def summary(courses: Sequence[Plan], workload: Workload) -> dict[str, float]:
    """What the drawn rollouts are like: mean response tokens (cut at the budget), the share
    that would run past the budget, mean turns, and the number of tool calls."""
    planned = [sum(p.turns) + sum(p.responses) for p in courses]
    return {
        "response_tokens_mean": sum(min(t, workload.max_response_tokens) for t in planned)
        / len(planned),
        "truncated": sum(t >= workload.max_response_tokens for t in planned) / len(planned),
        "turns_mean": sum(len(p.turns) for p in courses) / len(courses),
        "calls": sum(len(p.latencies) for p in courses),
    }


class SimRollout:
    """A plan played as a scheduler Agent. ``turn_ends`` is where engines note when each
    rollout's turn was generated, so tool wait counts from there (in rounds, a finished turn
    also waits for the rest of its round)."""

    def __init__(
        self, index: int, plan: Plan, workload: Workload, turn_ends: dict[int, float]
    ) -> None:
        self.index, self.plan, self.workload, self.turn_ends = index, plan, workload, turn_ends
        self.turn = 0
        self.response = 0  # model and tool tokens so far
        self.tool_wait_s = 0.0
        self.calls = 0

    def next_request(self) -> GenerationRequest:
        last = self.turn == len(self.plan.turns) - 1
        context = PlannedContext(
            self.index,
            self.plan.prompt + self.response,
            self.plan.turns[self.turn],
            "eos" if last else "stop",
        )
        return GenerationRequest(context, self.workload.max_response_tokens - self.response)

    def take_generation(self, generation: Generation) -> list[ExecuteRequest] | None:
        self.response += len(generation.token_ids)
        self.turn += 1
        if generation.finish_reason != "stop" or self.turn >= self.workload.max_turns:
            return None
        self.calls += 1
        return [ExecuteRequest(code="pass", id=f"{self.index}/{self.turn - 1}")]

    def take_results(self, results: list[ExecuteResult]) -> bool:
        self.tool_wait_s += asyncio.get_running_loop().time() - self.turn_ends[self.index]
        self.response += self.plan.responses[self.turn - 1]
        return self.response < self.workload.max_response_tokens


class SimToolService:
    """The sandbox service: ``slots`` executions at a time, each call taking the latency its
    plan drew; a batch request returns when its last call is done."""

    def __init__(self, plans: Sequence[Plan], slots: int) -> None:
        self._latency = {
            f"{i}/{turn}": latency
            for i, plan in enumerate(plans)
            for turn, latency in enumerate(plan.latencies)
        }
        self._free_at = [0.0] * slots  # a heap of the times each slot is next free

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        now = asyncio.get_running_loop().time()
        done = now
        for call in calls:
            start = max(now, heapq.heappop(self._free_at))
            end = start + self._latency[str(call.id)]
            heapq.heappush(self._free_at, end)
            done = max(done, end)
        await asyncio.sleep(done - now)
        return [ExecuteResult(id=call.id, status=Status.ok) for call in calls]
