"""engines.py: engines served over sockets, and rank 0's scheduler over every rank's engine.

The served-engine tests run server and client on real sockets in one process; the group test
runs two real ranks (gloo, spawned processes) with scripted engines, tools in subprocesses.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from transformers import PreTrainedTokenizerFast

from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.backends.scripted import ScriptedBackend
from trainer.config import RewardConfig
from trainer.engines import (
    EngineGroup,
    EngineServer,
    RemoteEngineError,
    RemoteKvEngine,
    connect,
    reachable_host,
)
from trainer.modeling import Policy
from trainer.parallel import DataParallel
from trainer.placement import KvCapacity, SchedulerSettings
from trainer.rollout import RolloutSettings
from trainer.scheduler import DriverMeter
from trainer.step import sample_groups
from trainer.tool_runners import SubprocessRunner
from trainer.toy_task import scripted_solver, toy_problems

PARAMS = SamplingParams()


class SlowEngine(GenerationBackend):
    """Echoes each prompt's last id ``length`` times after ``delay_s``; fails on an empty
    prompt. Reports 100 blocks of 4 tokens."""

    continuous_batching = True

    def __init__(self, delay_s: float = 0.05, length: int = 3) -> None:
        self.delay_s, self.length, self.running, self.most = delay_s, length, 0, 0

    def kv_capacity(self) -> KvCapacity:
        return KvCapacity(block_size=4, total_blocks=100, free_blocks=100, max_seqs=8)

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            if any(not r.prompt_ids for r in requests):
                raise ValueError("empty prompt")
            return [
                Generation([r.prompt_ids[-1]] * self.length, [0.0] * self.length, "eos")
                for r in requests
            ]
        finally:
            self.running -= 1


def test_a_served_engine_answers_concurrent_requests_and_counts_what_they_hold() -> None:
    async def run() -> None:
        engine = SlowEngine()
        server = EngineServer(engine)
        host, port = await server.start()
        remote = await connect(host, port)
        assert isinstance(remote, RemoteKvEngine) and remote.continuous_batching
        assert remote.kv_capacity() == engine.kv_capacity()
        requests = [[GenerationRequest([i, 7 + i], 10)] for i in range(5)]
        tasks = [asyncio.create_task(remote.generate(r, PARAMS)) for r in requests]
        await asyncio.sleep(0.02)
        # five requests in flight, 12 tokens each: 3 blocks of 4 apiece are held here
        assert remote.kv_capacity().free_blocks == 100 - 5 * 3
        answers = await asyncio.gather(*tasks)
        assert [a[0].token_ids for a in answers] == [[7 + i] * 3 for i in range(5)]
        assert engine.most == 5  # all five ran at once on the served engine
        assert remote.kv_capacity().free_blocks == 100
        await remote.end()
        await asyncio.wait_for(server.finished(), 5)
        assert server.served == 5

    asyncio.run(run())


def test_an_engine_failure_is_raised_where_the_turn_was_awaited() -> None:
    async def run() -> None:
        server = EngineServer(SlowEngine())
        remote = await connect(*await server.start())
        with pytest.raises(RemoteEngineError, match="ValueError: empty prompt"):
            await remote.generate([GenerationRequest([], 5)], PARAMS)
        [ok] = await remote.generate([GenerationRequest([3], 5)], PARAMS)  # the link survives
        assert ok.token_ids == [3, 3, 3]
        await remote.end()
        await asyncio.wait_for(server.finished(), 5)

    asyncio.run(run())


def test_a_server_that_goes_away_fails_the_turns_in_flight() -> None:
    async def run() -> None:
        server = EngineServer(SlowEngine(delay_s=10))
        remote = await connect(*await server.start())
        turn = asyncio.create_task(remote.generate([GenerationRequest([1], 5)], PARAMS))
        await asyncio.sleep(0.05)
        remote.writer.transport.abort()  # the link drops
        with pytest.raises(RemoteEngineError, match="closed"):
            await asyncio.wait_for(turn, 5)

    asyncio.run(run())


class Counted(ScriptedBackend):
    """A scripted engine that takes its time, so a second engine is worth using."""

    continuous_batching = True

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        await asyncio.sleep(0.05)
        return await super().generate(requests, params)


def sample(
    tokenizer: PreTrainedTokenizerFast,
    dp: DataParallel,
    scheduling: SchedulerSettings | None,
    caller: DataParallel | None = None,
) -> tuple[list[Any], list[int], DriverMeter]:
    """The toy step's groups on an EngineGroup of this rank's engine: (each rollout's
    response ids, grouped; the generate calls of this rank's engine; rank 0's meter).
    ``caller``: the ranks the caller passes (evaluation passes none: SINGLE)."""
    engine = Counted(tokenizer, scripted_solver)
    group = EngineGroup(engine, dp)
    policy = Policy(None, tokenizer, torch.device("cpu"), None)  # type: ignore[arg-type]
    settings = RolloutSettings(max_turns=3, max_response_tokens=400, scheduling=scheduling)
    meter = DriverMeter()
    groups = asyncio.run(
        sample_groups(
            toy_problems(3, seed=4),
            2,
            policy,
            group,
            SubprocessRunner(concurrency=2),
            settings,
            RewardConfig(),
            dp if caller is None else caller,
            meter,
        )
    )
    responses = [[(s.rollout.response_ids, s.reward) for s in g] for g in groups]
    return responses, engine.calls, meter


def rank_worker(rank: int, port: int, out: str, tokenizer: PreTrainedTokenizerFast) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    dp = DataParallel(rank, 2)
    result = sample(tokenizer, dp, SchedulerSettings("balanced"))
    evaluation, _, _ = sample(tokenizer, dp, SchedulerSettings("balanced"), DataParallel())
    Path(f"{out}.{rank}").write_bytes(pickle.dumps((*result, evaluation)))
    torch.distributed.barrier()
    sys.stdout.flush()
    os._exit(0)  # no C++ teardown (test_fsdp.leave_group says why)


def test_rank_zero_places_every_turn_on_both_ranks_engines(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    """Two ranks: rank 0's scheduler drives all six rollouts, its turns run on both engines,
    every rank gets the same groups, and they are the groups one process makes alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "rank")
    mp.spawn(rank_worker, args=(port, out, tokenizer), nprocs=2, join=True)
    (groups0, calls0, meter0, eval0), (groups1, calls1, meter1, eval1) = (
        pickle.loads(Path(f"{out}.{rank}").read_bytes()) for rank in (0, 1)
    )
    alone, _, _ = sample(tokenizer, DataParallel(), SchedulerSettings("balanced"))
    assert groups0 == groups1 == alone
    assert eval0 == eval1 == alone  # called as evaluation calls it, every rank still gets them
    assert all(reward == 1.0 for group in alone for _, reward in group)  # the tool really ran
    assert calls0 and calls1 and sum(calls0) + sum(calls1) == 12  # two turns of six rollouts
    assert meter0.rollouts == 6 and len(meter0.engine_busy_s) == 2 and meter0.tool_wait_s > 0
    assert meter1.rollouts == 0  # rank 1 only served


def test_the_driver_meter_counts_idle_engines_and_tool_wait(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """In rounds with one engine, the engine idles exactly while the round's tools run, and
    each rollout waits for them: idle time is the tool wait of one rollout, roughly."""
    _, _, meter = sample(tokenizer, DataParallel(), None)
    metrics = meter.metrics()
    assert metrics["engines"] == 1 and meter.rollouts == 6
    assert 0 < metrics["engine_idle_s"] <= meter.wall_s
    assert metrics["engine_idle_s"] == pytest.approx(metrics["tool_wait_s"], rel=0.3)


def test_servers_listen_where_rank_zero_can_reach_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """On rank 0's node (MASTER_ADDR local or unset) the loopback; unroutable: the loopback."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert reachable_host() == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert reachable_host() == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    assert reachable_host() == "127.0.0.1"
