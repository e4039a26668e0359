"""Compare rollout policies on one simulated RL step; the real scheduler drives every one.

    python -m trainer.sim --seed 0 [--engines 4] [--rollouts 1024] [--slots 512] ...

prints one line per policy and then ``speedup: X.XX``, the step time of static + synchronous
tools over that of load-balanced + asynchronous tools:

- ``static+sync``: N rollouts per engine (contiguous shards, so a prompt's group shares an
  engine); in rounds, every unfinished rollout generates a turn, then all calls of the round
  go to the service in one batch (:func:`trainer.scheduler.run_in_rounds`, what
  ``rollout.scheduler: rounds`` runs).
- ``static+async``: the same engines per rollout; each rollout's calls leave when its turn
  ends, batched by the dispatcher's window, and its next turn follows its results
  (:func:`trainer.scheduler.run_async` with ``assignment="static"``).
- ``balanced+async``: the same, with turns assigned by free KV cache and prefix affinity.

Per policy: the step time (until the last rollout ends), engine idle (the share of engine
time with nothing running), KV preemptions (a running request evicted because the cache
overflowed, then recomputed), and tool wait (per call, from the end of the turn that made it to
its result: the rest of the round, the window, the service), and prefix reuse (the share of
context admitted to an engine that its prefix cache already held). Other flags change the
engines (``--kv-blocks``), the workload and the scheduler's settings; ``docs/benchmarks.md``
has figures for several.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from trainer.backends.base import SamplingParams
from trainer.placement import Assignment, RolloutScheduler, SchedulerSettings
from trainer.scheduler import run_async, run_in_rounds
from trainer.sim import clock
from trainer.sim.engine import EngineModel, SimEngine
from trainer.sim.workload import (
    LogNormal,
    Plan,
    SimRollout,
    SimToolService,
    Workload,
    measured_latencies,
    plans,
)
from trainer.tool_dispatch import ToolDispatcher

POLICIES = ("static+sync", "static+async", "balanced+async")


@dataclass(frozen=True)
class Setup:
    engines: int = 4
    engine: EngineModel = field(default_factory=EngineModel)
    workload: Workload = field(default_factory=Workload)
    service_slots: int = 512
    tool_batch_size: int = 64
    tool_batch_timeout_s: float = 0.01
    latency_max_s: float | None = None  # leave out measured calls slower than this
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)


@dataclass(frozen=True)
class Outcome:
    policy: str
    step_s: float
    engine_idle: float
    preemptions: int
    tool_wait_s: float  # mean per call
    prefix_reuse: float  # share of admitted context found in the prefix cache

    def line(self) -> str:
        return (
            f"{self.policy:<15} step {self.step_s:8.1f} s   engine idle {self.engine_idle:6.1%}"
            f"   KV preemptions {self.preemptions:5d}   tool wait {self.tool_wait_s:6.2f} s/call"
            f"   prefix reuse {self.prefix_reuse:6.1%}"
        )


def simulate(policy: str, setup: Setup, courses: Sequence[Plan]) -> Outcome:
    """One step of ``courses`` under ``policy``, on simulated time."""
    return clock.run(_step(policy, setup, courses))


async def _step(policy: str, setup: Setup, courses: Sequence[Plan]) -> Outcome:
    turn_ends: dict[int, float] = {}
    engines = [SimEngine(setup.engine, turn_ends) for _ in range(setup.engines)]
    agents = [SimRollout(i, plan, setup.workload, turn_ends) for i, plan in enumerate(courses)]
    service = SimToolService(courses, setup.service_slots)
    params = SamplingParams()
    if policy == "static+sync":
        await run_in_rounds(agents, engines, service, params)
    else:
        assignment: Assignment = "static" if policy == "static+async" else "balanced"
        settings = replace(setup.scheduler, assignment=assignment)
        scheduler = RolloutScheduler(engines, params, settings)
        tools = ToolDispatcher(service, setup.tool_batch_size, setup.tool_batch_timeout_s)
        await run_async(agents, scheduler, tools)
    step = asyncio.get_running_loop().time()
    for engine in engines:
        await engine.aclose()
    counters = [e.counters for e in engines]
    admitted = sum(c.prefill_tokens + c.reused_tokens for c in counters)
    calls = sum(a.calls for a in agents)
    return Outcome(
        policy=policy,
        step_s=step,
        engine_idle=1 - sum(c.busy_s for c in counters) / (step * len(engines)),
        preemptions=sum(c.preemptions for c in counters),
        tool_wait_s=sum(a.tool_wait_s for a in agents) / max(1, calls),
        prefix_reuse=sum(c.reused_tokens for c in counters) / max(1, admitted),
    )


def compare(setup: Setup, seed: int) -> list[Outcome]:
    courses = plans(setup.workload, latencies(setup), seed)
    return [simulate(policy, setup, courses) for policy in POLICIES]


def latencies(setup: Setup) -> list[float]:
    cap = setup.latency_max_s
    return [s for s in measured_latencies() if cap is None or s <= cap]


def speedup(outcomes: Sequence[Outcome]) -> float:
    by_policy = {o.policy: o for o in outcomes}
    return by_policy["static+sync"].step_s / by_policy["balanced+async"].step_s


def parse_setup(argv: Sequence[str] | None = None) -> tuple[Setup, int]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", type=int, default=Setup.engines)
    parser.add_argument("--rollouts", type=int, default=Workload.rollouts)
    parser.add_argument("--max-response-tokens", type=int, default=Workload.max_response_tokens)
    parser.add_argument("--max-turns", type=int, default=Workload.max_turns)
    parser.add_argument("--tool-calls-mean", type=float, default=Workload.tool_calls_mean)
    parser.add_argument(
        "--turn-tokens",
        type=float,
        nargs=2,
        metavar=("MEDIAN", "SIGMA"),
        default=(Workload.turn_tokens.median, Workload.turn_tokens.sigma),
        help="log-normal model tokens per turn",
    )
    parser.add_argument(
        "--chunk-tokens", type=int, default=SchedulerSettings.chunk_tokens, help="0: whole turns"
    )
    parser.add_argument("--locality-wait-s", type=float, default=SchedulerSettings.locality_wait_s)
    parser.add_argument(
        "--latency-max-s",
        type=float,
        help="leave out measured tool calls slower than this (5: without the hung ones)",
    )
    parser.add_argument("--kv-blocks", type=int, default=EngineModel.kv_blocks)
    parser.add_argument("--slots", type=int, default=Setup.service_slots, help="service slots")
    parser.add_argument("--tool-batch-size", type=int, default=Setup.tool_batch_size)
    parser.add_argument("--tool-batch-timeout-s", type=float, default=Setup.tool_batch_timeout_s)
    args = parser.parse_args(argv)
    workload = replace(
        Workload(),
        rollouts=args.rollouts,
        max_response_tokens=args.max_response_tokens,
        max_turns=args.max_turns,
        tool_calls_mean=args.tool_calls_mean,
        turn_tokens=LogNormal(*args.turn_tokens),
    )
    setup = Setup(
        engines=args.engines,
        engine=replace(EngineModel(), kv_blocks=args.kv_blocks),
        workload=workload,
        service_slots=args.slots,
        tool_batch_size=args.tool_batch_size,
        tool_batch_timeout_s=args.tool_batch_timeout_s,
        latency_max_s=args.latency_max_s,
        scheduler=SchedulerSettings(
            chunk_tokens=args.chunk_tokens or None, locality_wait_s=args.locality_wait_s
        ),
    )
    return setup, args.seed


def main(argv: Sequence[str] | None = None) -> None:
    setup, seed = parse_setup(argv)
    courses = plans(setup.workload, latencies(setup), seed)
    outcomes = []
    for policy in POLICIES:
        outcomes.append(simulate(policy, setup, courses))
        print(outcomes[-1].line(), flush=True)
    print(f"speedup: {speedup(outcomes):.2f}")
