"""placement.py, tool_dispatch.py, scheduler.py: turn placement by KV capacity and prefix
affinity, the tool-call window, and
the asynchronous loop end to end with the transformers backend and the real service.

The unit tests run on simulated time (``trainer.sim.clock``): they take no wall-clock time, and
timings are exact.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.service_process import ServiceProcess
from trainer.backends.base import (
    FinishReason,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from trainer.backends.hf import HFBackend
from trainer.backends.scripted import ScriptedBackend
from trainer.chat import EOS, IM_START, decode, prompt_text
from trainer.config import TinyModelConfig, load_config
from trainer.placement import (
    EngineLoad,
    KvCapacity,
    RolloutScheduler,
    SchedulerSettings,
    choose_engine,
    static_engine,
)
from trainer.reward import reward
from trainer.rollout import Rollout, RolloutSettings, generate_rollouts
from trainer.scheduler import run_in_rounds
from trainer.sim import clock
from trainer.step import rollout_settings, scheduler_settings
from trainer.tiny_model import build_model
from trainer.tool_dispatch import ToolDispatcher
from trainer.tool_runners import SandboxRunner, SubprocessRunner
from trainer.tools import format_tool_call, user_prompt
from trainer.toy_task import scripted_solver, toy_problems

PARAMS = SamplingParams()
BALANCED = SchedulerSettings("balanced", chunk_tokens=None, locality_wait_s=1.0)


class FakeEngine(GenerationBackend):
    """A continuously batching engine with ``total`` tokens of KV cache that fails the test if
    it is ever asked to hold more: a request holds its prompt plus its ``max_new_tokens``.
    A request's prompt starts with its rollout's tag; the rollout's turn writes ``plan[tag]``
    tokens (in as many requests as it takes), one token per ``token_s`` seconds."""

    continuous_batching = True

    def __init__(self, total: int, plan: dict[int, int], token_s: float = 0.01) -> None:
        self.total, self.plan, self.token_s = total, plan, token_s
        self.held: dict[int, int] = {}  # request number -> tokens held
        self.log: list[tuple[float, int, int, int]] = []  # (start, tag, prompt len, max new)
        self._count = 0

    def kv_capacity(self) -> KvCapacity:
        return KvCapacity(1, self.total, self.total - sum(self.held.values()))

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        [request] = requests
        loop = asyncio.get_running_loop()
        number, self._count = self._count, self._count + 1
        self.held[number] = len(request.prompt_ids) + request.max_new_tokens
        assert sum(self.held.values()) <= self.total, "asked for more than the KV cache holds"
        tag = request.prompt_ids[0]
        self.log.append((loop.time(), tag, len(request.prompt_ids), request.max_new_tokens))
        n = min(self.plan[tag], request.max_new_tokens)
        await asyncio.sleep(n * self.token_s)
        self.plan[tag] -= n
        del self.held[number]
        reason: FinishReason = "eos" if self.plan[tag] == 0 else "length"
        return [Generation([tag] * n, [0.0] * n, reason)]

    def tags(self) -> list[int]:
        return [tag for _, tag, _, _ in self.log]


def request(tag: int, prompt: int, new: int) -> GenerationRequest:
    return GenerationRequest([tag] * prompt, new)


async def later(delay: float, coroutine):  # type: ignore[no-untyped-def]
    await asyncio.sleep(delay)
    return await coroutine


# ------------------------------------------------------------------------ assignment policy


def test_choose_engine_prefers_home_then_room_and_never_overfills() -> None:
    loads = [EngineLoad(100, running=1), EngineLoad(100, reserved_blocks=30, running=1)]
    assert choose_engine(loads, 50, home=None) == 0  # the most room
    assert choose_engine(loads, 50, home=1) == 1  # home has room: home
    assert choose_engine(loads, 80, home=1, patient=True) is None  # home full: wait for it
    assert choose_engine(loads, 80, home=1) == 0  # ... or, impatient, go where it fits
    assert choose_engine(loads, 101, home=None) is None  # fits nowhere
    loads.append(EngineLoad(100))  # an idle engine: a busy home gives a rollout up to it
    assert choose_engine(loads, 50, home=1) == 2
    assert choose_engine(loads, 50, home=1, allowed={0, 1}) == 1
    seats = [EngineLoad(100, max_seqs=1, running=1)]
    assert choose_engine(seats, 1, home=0) is None  # no seat left, whatever the room


def test_capacity_is_never_exceeded_and_every_request_completes() -> None:
    """Random rollouts of random turns on three engines of different sizes: no engine is ever
    asked for more than it holds (FakeEngine asserts it), and every turn is generated."""
    rng = random.Random(7)
    turns = {tag: [rng.randint(1, 30) for _ in range(rng.randint(1, 4))] for tag in range(60)}
    plan: dict[int, int] = {}
    engines = [FakeEngine(total, plan) for total in (400, 250, 150)]
    scheduler = RolloutScheduler(engines, PARAMS, BALANCED)

    async def rollout(tag: int) -> int:
        await asyncio.sleep(rng.random())
        written = 0
        for tokens in turns[tag]:
            plan[tag] = tokens
            prompt = 10 + written
            generation = await scheduler.generate(tag, request(tag, prompt, 140 - prompt))
            written += len(generation.token_ids)
            await asyncio.sleep(rng.random() / 10)  # a tool call
        return written

    async def main() -> list[int]:
        return list(await asyncio.gather(*(rollout(tag) for tag in turns)))

    written = clock.run(main())
    assert written == [sum(turns[tag]) for tag in turns]
    assert all(load.reserved_blocks == 0 and load.running == 0 for load in scheduler.loads)
    assert scheduler.stats.waits > 0  # capacity was the constraint, not a formality
    assert all(e.log for e in engines)


def test_a_rollouts_next_turn_goes_back_to_the_engine_holding_its_prefix() -> None:
    plan = {0: 5, 1: 100, 2: 100}
    engines = [FakeEngine(1000, plan), FakeEngine(1000, plan)]
    scheduler = RolloutScheduler(engines, PARAMS, BALANCED)

    async def main() -> None:
        await scheduler.generate(0, request(0, 10, 50))  # rollout 0 on engine 0 (a tie)
        busy = [  # both engines now have work; neither is idle
            asyncio.ensure_future(scheduler.generate(1, request(1, 10, 200))),
            asyncio.ensure_future(scheduler.generate(2, request(2, 10, 200))),
        ]
        await asyncio.sleep(0.1)
        plan[0] = 5
        await scheduler.generate(0, request(0, 20, 50))
        await asyncio.gather(*busy)

    clock.run(main())
    assert engines[0].tags() == [0, 1, 0] and engines[1].tags() == [2]
    assert scheduler.stats.affinity_kept == 1 and scheduler.stats.moved == 0


@pytest.mark.parametrize(
    ("hold_tokens", "expected_engine", "expected_wait"), [(80, 1, 1.0), (5, 0, 0.5)]
)
def test_a_full_home_is_waited_for_then_left(
    hold_tokens: int, expected_engine: int, expected_wait: float
) -> None:
    """Home full: the turn waits ``locality_wait_s`` for it, then goes where there is room
    (its prefix is recomputed there); if home frees up in time, it stays."""
    plan = {0: 1, 1: hold_tokens, 2: 60}
    engines = [FakeEngine(100, plan, token_s=0.1), FakeEngine(100, plan, token_s=0.1)]
    scheduler = RolloutScheduler(engines, PARAMS, BALANCED)

    async def main() -> None:
        await scheduler.generate(0, request(0, 10, 10))  # home: engine 0 (a tie)
        work = [
            asyncio.ensure_future(scheduler.generate(1, request(1, 10, 85))),  # fills engine 0
            asyncio.ensure_future(scheduler.generate(2, request(2, 10, 60))),  # 1 is not idle
        ]
        await asyncio.sleep(0)
        plan[0] = 5
        await scheduler.generate(0, request(0, 11, 10))
        await asyncio.gather(*work)

    clock.run(main())
    engine = engines[expected_engine]
    [started] = [t for t, tag, prompt, _ in engine.log if tag == 0 and prompt == 11]
    assert started == pytest.approx(0.1 + expected_wait)
    assert scheduler.stats.moved == (expected_engine != 0)


def test_an_idle_engine_takes_a_turn_from_a_busy_home_at_once() -> None:
    plan = {0: 1, 1: 500}
    engines = [FakeEngine(1000, plan), FakeEngine(1000, plan)]
    scheduler = RolloutScheduler(engines, PARAMS, BALANCED)

    async def main() -> None:
        await scheduler.generate(0, request(0, 10, 10))
        busy = asyncio.ensure_future(scheduler.generate(1, request(1, 10, 600)))
        await asyncio.sleep(0)
        plan[0] = 1
        await scheduler.generate(0, request(0, 11, 10))
        await busy

    clock.run(main())
    assert engines[0].tags() == [0, 1] and engines[1].tags() == [0]
    assert scheduler.stats.moved == 1


def test_no_request_starves_behind_younger_ones() -> None:
    """An old rollout's big turn that fits nowhere for now is placed before any turn of a
    younger rollout, however many of those keep arriving and would fit."""
    plan = {0: 1, 1: 100, 2: 100}
    engine = FakeEngine(1000, plan)
    scheduler = RolloutScheduler([engine], PARAMS, BALANCED)
    younger = list(range(10, 40))
    plan.update(dict.fromkeys(younger, 5))

    async def small(tag: int) -> None:
        await later(0.1 + tag / 100, scheduler.generate(tag, request(tag, 10, 90)))

    async def main() -> None:
        await scheduler.generate(0, request(0, 10, 10))  # rollout 0 arrives first
        holders = [
            asyncio.ensure_future(scheduler.generate(1, request(1, 10, 290))),
            asyncio.ensure_future(scheduler.generate(2, request(2, 10, 290))),
        ]
        await asyncio.sleep(0.05)
        plan[0] = 10
        big = asyncio.ensure_future(scheduler.generate(0, request(0, 20, 880)))
        await asyncio.gather(big, *holders, *(small(tag) for tag in younger))

    clock.run(main())
    order = engine.tags()
    assert order.index(0, 1) < min(order.index(tag) for tag in younger)
    assert sorted(order[order.index(0, 1) + 1 :]) == younger  # and then every young one ran


def test_a_request_no_engine_can_hold_is_refused() -> None:
    scheduler = RolloutScheduler([FakeEngine(100, {0: 1})], PARAMS, BALANCED)
    with pytest.raises(ValueError, match="fits in no engine"):
        clock.run(scheduler.generate(0, request(0, 10, 200)))


def test_a_cancelled_wait_leaves_the_queue_and_the_ledger_clean() -> None:
    plan = {0: 100, 1: 1, 2: 1}
    engine = FakeEngine(100, plan)
    scheduler = RolloutScheduler([engine], PARAMS, BALANCED)

    async def main() -> None:
        holder = asyncio.ensure_future(scheduler.generate(0, request(0, 10, 80)))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(scheduler.generate(1, request(1, 10, 50)))
        await asyncio.sleep(0.1)
        waiting.cancel()  # its rollout gave up before room freed
        await asyncio.gather(holder, scheduler.generate(2, request(2, 10, 50)))

    clock.run(main())
    assert engine.tags() == [0, 2]
    assert scheduler.loads[0].reserved_blocks == 0 and not scheduler._waiting


def test_turns_are_generated_in_chunks_on_one_engine() -> None:
    plan = {0: 10}
    engines = [FakeEngine(1000, plan), FakeEngine(1000, plan)]
    settings = SchedulerSettings("balanced", chunk_tokens=4, locality_wait_s=1.0)
    scheduler = RolloutScheduler(engines, PARAMS, settings)
    generation = clock.run(scheduler.generate(0, request(0, 7, 50)))
    assert generation.token_ids == [0] * 10 and generation.finish_reason == "eos"
    # 4 + 4 + 2 tokens, each chunk's prompt the previous one's plus what it wrote.
    assert [(prompt, new) for _, _, prompt, new in engines[0].log] == [(7, 4), (11, 4), (15, 4)]
    assert not engines[1].log and scheduler.stats.continued == 2


def test_static_deals_out_contiguous_shards() -> None:
    engines = ["a", "b", "c"]
    assert [static_engine(i, 7, engines) for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    plan = dict.fromkeys(range(6), 1)
    fakes = [FakeEngine(10, plan), FakeEngine(10, plan)]  # static never checks capacity
    scheduler = RolloutScheduler(fakes, PARAMS, SchedulerSettings("static"))
    scheduler.expect(6)

    async def main() -> None:
        await asyncio.gather(*(scheduler.generate(i, request(i, 1, 1)) for i in range(6)))

    clock.run(main())
    assert (sorted(fakes[0].tags()), sorted(fakes[1].tags())) == ([0, 1, 2], [3, 4, 5])


def test_rounds_put_each_rollout_on_its_static_engine(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    class Agent:
        def __init__(self) -> None:
            self.turns = 0

        def next_request(self) -> GenerationRequest:
            return GenerationRequest(tokenizer.encode("q"), 5)

        def take_generation(self, generation: Generation) -> list[ExecuteRequest] | None:
            self.turns += 1
            return None if self.turns == 2 else [ExecuteRequest(code="1")]

        def take_results(self, results: list[ExecuteResult]) -> bool:
            return True

    class Runner:
        def __init__(self) -> None:
            self.batches: list[int] = []

        async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
            self.batches.append(len(calls))
            return [ExecuteResult(status=Status.ok)] * len(calls)

    engines = [ScriptedBackend(tokenizer, lambda t, n: f"x{EOS}") for _ in range(2)]
    runner = Runner()
    asyncio.run(run_in_rounds([Agent() for _ in range(5)], engines, runner, PARAMS))
    assert [e.calls for e in engines] == [[3, 3], [2, 2]]  # agents 0-2 and 3-4, two rounds
    assert runner.batches == [5]


def test_asynchronous_rollouts_are_the_rounds_rollouts_for_a_deterministic_policy(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Only when turns run changes, not what they write: a scripted policy gives the same
    transcripts in rounds and under either asynchronous scheduler (two engines, which are
    not continuously batching, so turns are gathered into ``generate`` calls)."""
    problems = [p.problem for p in toy_problems(6, seed=2)]
    prompts = [
        tokenizer.encode(prompt_text(user_prompt(p)), add_special_tokens=False) for p in problems
    ]
    transcripts = {}
    for name, scheduling in (
        ("rounds", None),
        ("static", SchedulerSettings("static")),
        ("balanced", SchedulerSettings("balanced")),
    ):
        settings = RolloutSettings(max_turns=4, max_response_tokens=400, scheduling=scheduling)
        engines = [ScriptedBackend(tokenizer, scripted_solver) for _ in range(2)]
        rollouts = asyncio.run(
            generate_rollouts(prompts, engines, tokenizer, SubprocessRunner(), settings)
        )
        transcripts[name] = [(r.response_ids, r.loss_mask, r.finish) for r in rollouts]
        assert sum(sum(e.calls) for e in engines) == 12  # two turns of each of six rollouts
    assert transcripts["static"] == transcripts["rounds"] == transcripts["balanced"]
    assert all(finish == "eos" for _, _, finish in transcripts["rounds"])


def test_the_config_chooses_the_scheduler() -> None:
    assert scheduler_settings(load_config(None)) is None  # rounds by default
    chunks = {"rollout.scheduler": "balanced", "rollout.chunk_tokens": 512}
    config = load_config(None, {**chunks, "rollout.backend": "vllm"})
    assert scheduler_settings(config) == SchedulerSettings("balanced", 512, 2.0)
    assert rollout_settings(config, 4, 100).scheduling == SchedulerSettings("balanced", 512, 2.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        load_config(None, {"rollout.chunk_tokens": 0})


# ------------------------------------------------------------------------ the tool-call window


class RecordingRunner:
    def __init__(self, latency_s: float = 0.5, fail: bool = False) -> None:
        self.latency_s, self.fail = latency_s, fail
        self.sent: list[tuple[float, list[str]]] = []

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        self.sent.append((asyncio.get_running_loop().time(), [c.code for c in calls]))
        await asyncio.sleep(self.latency_s)
        if self.fail:
            raise RuntimeError("service down")
        return [ExecuteResult(status=Status.ok, stdout=c.code) for c in calls]


def calls(*codes: str) -> list[ExecuteRequest]:
    return [ExecuteRequest(code=c) for c in codes]


def test_a_full_window_leaves_at_once_and_the_rest_at_the_timeout() -> None:
    runner = RecordingRunner()
    tools = ToolDispatcher(runner, batch_size=3, timeout_s=1.0)

    async def main() -> list[list[ExecuteResult]]:
        return list(await asyncio.gather(*(tools.run(calls(str(i))) for i in range(7))))

    results = clock.run(main())
    assert [r.stdout for [r] in results] == [str(i) for i in range(7)]
    assert runner.sent == [
        (0.0, ["0", "1", "2"]),
        (0.0, ["3", "4", "5"]),
        (1.0, ["6"]),
    ]
    assert tools.stats.batches == [3, 3, 1] and tools.stats.calls == 7


def test_the_timeout_counts_from_the_oldest_waiting_call() -> None:
    runner = RecordingRunner()
    tools = ToolDispatcher(runner, batch_size=10, timeout_s=1.0)

    async def main() -> list[list[ExecuteResult]]:
        first = asyncio.ensure_future(tools.run(calls("a", "b")))  # one turn's two calls
        second = asyncio.ensure_future(later(0.4, tools.run(calls("c"))))
        third = asyncio.ensure_future(later(1.2, tools.run(calls("d"))))
        return list(await asyncio.gather(first, second, third))

    results = clock.run(main())
    assert [[r.stdout for r in rs] for rs in results] == [["a", "b"], ["c"], ["d"]]
    assert runner.sent == [(1.0, ["a", "b", "c"]), (2.2, ["d"])]
    assert tools.stats.wait_s == pytest.approx(2 * 1.5 + 1.1 + 1.5)


def test_batches_in_flight_do_not_wait_for_each_other() -> None:
    class Uneven(RecordingRunner):
        async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
            self.latency_s = 5.0 if calls[0].code == "slow" else 0.1
            return await super().run(calls)

    tools = ToolDispatcher(Uneven(), batch_size=1, timeout_s=1.0)
    done: dict[str, float] = {}

    async def call(code: str) -> None:
        await tools.run(calls(code))
        done[code] = asyncio.get_running_loop().time()

    async def main() -> None:
        await asyncio.gather(call("slow"), call("fast"))

    clock.run(main())
    assert done == {"slow": pytest.approx(5.0), "fast": pytest.approx(0.1)}


def test_a_failed_batch_fails_only_its_own_calls() -> None:
    runner = RecordingRunner(fail=True)
    tools = ToolDispatcher(runner, batch_size=2, timeout_s=1.0)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="service down"):
            await tools.run(calls("a", "b"))
        runner.fail = False
        [result] = await tools.run(calls("c"))
        assert result.stdout == "c"

    clock.run(main())


# ------------------------------------------------------------------------ end to end


def scripted_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> PreTrainedModel:
    """A tiny Qwen2 from ``trainer.tiny_model`` whose logits are pushed, row by row, toward the toy
    task done right (call the tool on the problem's expression; then box the number the tool
    printed), so that generation through ``HFBackend`` really calls the tool."""
    torch.manual_seed(seed)
    model = build_model(tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64))
    model.generation_config.use_cache = False  # the hook below sees whole rows
    marker = tokenizer.encode(f"{IM_START}assistant\n", add_special_tokens=False)

    def target(transcript: str) -> str:
        printed = re.findall(r"stdout: (-?\d+)", transcript)
        if printed:
            return f"<answer>\\boxed{{{printed[-1]}}}</answer>{EOS}"
        expression = re.findall(r"What is (.*?)\?", transcript)[-1]
        return format_tool_call(f"print({expression})")

    def steer(module, args, kwargs, output):  # type: ignore[no-untyped-def]
        ids = kwargs["input_ids"]
        for row in range(ids.shape[0]):
            tokens = ids[row].tolist()
            starts = [i for i in range(len(tokens)) if tokens[i : i + len(marker)] == marker]
            turn_start = starts[-1] + len(marker)
            wanted = tokenizer.encode(target(decode(tokenizer, tokens)), add_special_tokens=False)
            written = len(tokens) - turn_start
            nxt = wanted[written] if written < len(wanted) else tokenizer.eos_token_id
            output.logits[row, -1, nxt] += 1e4
        return output

    model.register_forward_hook(steer, with_kwargs=True)
    return model


class CountingRunner(SandboxRunner):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[int] = []

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        self.batches.append(len(calls))
        return await super().run(calls)


class LoggedHF(HFBackend):
    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        super().__init__(model, tokenizer)
        self.prompts: list[str] = []

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        self.prompts += [decode(self.tokenizer, r.prompt_ids) for r in requests]
        return await super().generate(requests, params)


def test_balanced_async_rollouts_with_the_hf_backend_and_the_real_service(
    service: ServiceProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    """Two transformers engines (tiny models steered to solve the toy task with the tool),
    the balanced scheduler, tool calls windowed into batches to the real sandbox service: every
    rollout's call ran in the sandbox and its answer is right."""
    problems = toy_problems(8, seed=11)
    prompts = [
        tokenizer.encode(prompt_text(user_prompt(p.problem)), add_special_tokens=False)
        for p in problems
    ]
    engines = [LoggedHF(scripted_model(tokenizer, seed), tokenizer) for seed in (0, 1)]
    settings = RolloutSettings(
        max_turns=3,
        max_response_tokens=200,
        scheduling=SchedulerSettings("balanced"),
        tool_batch_size=3,
        tool_batch_timeout_s=0.05,
    )

    runner = CountingRunner(service.url)

    async def main() -> list[Rollout]:
        async with runner:
            return await generate_rollouts(prompts, engines, tokenizer, runner, settings)

    rollouts = asyncio.run(main())
    for rollout, problem in zip(rollouts, problems, strict=True):
        assert (rollout.turns, rollout.tool_calls, rollout.tool_errors) == (2, 1, 0)
        assert rollout.finish == "eos"
        assert f"stdout: {problem.answer}" in decode(tokenizer, rollout.response_ids)
        assert reward(rollout.model_text, problem.answer, truncated=False, require_answer_tag=True)
    assert sum(runner.batches) == 8 and max(runner.batches) <= 3
    assert all(engine.prompts for engine in engines)  # both engines generated
    assert sum(len(engine.prompts) for engine in engines) == 16  # two turns of each rollout
