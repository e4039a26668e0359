"""trainer/sim: the simulated clock and engine, the workload, the recorder, and the comparison
(deterministic for a seed, driven by the real scheduler). The figures themselves are printed
by ``python -m trainer.sim``, not asserted here."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import random
import re
import statistics
from dataclasses import replace

import pytest

import trainer.placement
from sandbox_service.service_process import ServiceProcess
from trainer.backends.base import GenerationRequest, SamplingParams
from trainer.sim import clock, compare
from trainer.sim.engine import EngineModel, PlannedContext, SimEngine
from trainer.sim.record import DATA, KINDS, measure, programs
from trainer.sim.workload import Workload, measured_latencies, plans

SMALL = compare.Setup(engines=2, workload=replace(Workload(), rollouts=128, group_size=16))


def test_the_clock_jumps_and_reports_a_deadlock() -> None:
    async def nap() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert clock.run(nap()) == 3600.0

    async def stuck() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(clock.Deadlock):
        clock.run(stuck())


def generate(engine: SimEngine, rollout: int, context: int, tokens: int, new: int = 10_000):
    request = GenerationRequest(PlannedContext(rollout, context, tokens, "eos"), new)
    return engine.generate([request], SamplingParams())


def test_the_engine_preempts_on_overflow_and_reuses_cached_prefixes() -> None:
    model = EngineModel(kv_blocks=10, block_size=10, steps_per_event=1)
    engine = SimEngine(model)

    async def main() -> list[int]:
        first = await generate(engine, 0, 35, 10)  # 45 tokens, 4 whole blocks stay cached
        both = await asyncio.gather(generate(engine, 1, 30, 40), generate(engine, 2, 30, 40))
        again = await generate(engine, 0, 50, 5)  # its prefix was evicted meanwhile
        await engine.aclose()
        return [len(g.token_ids) for gs in (first, *both, again) for g in gs]

    assert clock.run(main()) == [10, 40, 40, 5]
    # Two requests growing to 70 tokens each cannot share 100: one was preempted and rerun.
    assert engine.counters.preemptions >= 1
    assert engine.counters.reused_tokens == 0

    engine = SimEngine(model)

    async def twice() -> None:
        await generate(engine, 0, 35, 10)
        await generate(engine, 0, 50, 5)  # 40 of its 50 context tokens are cached
        await engine.aclose()

    clock.run(twice())
    assert engine.counters.reused_tokens == 40
    assert engine.counters.prefill_tokens == 35 + 10


def test_plans_are_a_function_of_the_seed_and_groups_share_difficulty() -> None:
    latencies = measured_latencies()
    workload = replace(Workload(), rollouts=1024, group_size=32)
    assert plans(workload, latencies, 5) == plans(workload, latencies, 5)
    assert plans(workload, latencies, 5) != plans(workload, latencies, 6)
    courses = plans(workload, latencies, 5)
    logs = [sum(math.log(t) for t in p.turns) / len(p.turns) for p in courses]
    shuffled = random.Random(0).sample(logs, len(logs))

    def spread(values: list[float]) -> float:  # variance of the groups' means
        return statistics.pvariance(
            [statistics.mean(values[g : g + 32]) for g in range(0, len(values), 32)]
        )

    assert spread(logs) > 4 * spread(shuffled)  # a hard prompt's samples are all long
    assert all(len(p.turns) <= workload.max_turns for p in courses)


def test_the_comparison_is_deterministic_and_uses_the_real_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placed = collections.Counter[str]()
    real_choose = trainer.placement.choose_engine

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        placed["choose_engine"] += 1
        return real_choose(*args, **kwargs)

    monkeypatch.setattr(trainer.placement, "choose_engine", counting)
    first = compare.compare(SMALL, seed=1)
    assert compare.compare(SMALL, seed=1) == first
    assert placed["choose_engine"] > 2 * SMALL.workload.rollouts
    by_policy = {o.policy: o for o in first}
    assert list(by_policy) == list(compare.POLICIES)
    assert by_policy["balanced+async"].preemptions == 0
    # Rounds make every finished turn wait for the rest of its round; windowed calls do not.
    assert by_policy["static+sync"].tool_wait_s > 10 * by_policy["balanced+async"].tool_wait_s


def test_balanced_never_overflows_a_tight_kv_cache_that_static_does() -> None:
    tight = replace(SMALL, engine=replace(EngineModel(), kv_blocks=3000))  # 48K tokens
    outcomes = {o.policy: o for o in compare.compare(tight, seed=0)}
    assert outcomes["static+async"].preemptions > 0
    assert outcomes["balanced+async"].preemptions == 0


def test_the_command_prints_a_line_per_policy_then_the_speedup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    compare.main(["--seed", "0", "--rollouts", "64", "--engines", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == list(compare.POLICIES)
    assert re.fullmatch(r"speedup: \d+\.\d\d", lines[-1])


def test_the_recorded_latencies_are_a_few_hundred_calls_of_the_mix() -> None:
    record = json.loads(DATA.read_text())
    kinds = collections.Counter(s["kind"] for s in record["samples"])
    assert len(record["samples"]) >= 300 and set(kinds) == set(KINDS)
    assert record["mix"] == {kind: weight for kind, (weight, _) in KINDS.items()}
    hung = [s for s in record["samples"] if s["kind"] == "never_ends"]
    assert all(s["status"] == "timeout" and s["latency_s"] >= 10 for s in hung)
    assert collections.Counter(kind for kind, _ in programs(400, 0)) == kinds


def test_the_recorder_measures_calls_on_the_real_service(service: ServiceProcess) -> None:
    samples = asyncio.run(measure(service.url, count=10, seed=3, in_flight=2))
    assert len(samples) == 10
    statuses = {(s["kind"], s["status"]) for s in samples}
    assert ("raises", "error") in statuses and ("arithmetic", "ok") in statuses
    assert all(float(s["latency_s"]) >= float(s["run_s"]) > 0 for s in samples)  # type: ignore[arg-type]
