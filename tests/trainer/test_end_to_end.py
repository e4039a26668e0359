"""End to end against the real embedded sandbox service: a scripted policy that calls the tool,
the rollout loop, rewards, Resample-on-Correct, two GRPO updates of a tiny model, a checkpoint,
a resume, and one more step."""

from __future__ import annotations

import asyncio
import math
import random
import re
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from sandbox_service.models import ExecuteRequest, ExecuteResult
from sandbox_service.service_process import ServiceProcess
from trainer.backends.scripted import Script, ScriptedBackend
from trainer.chat import EOS, decode
from trainer.checkpoint import TrainState, load_training_state, save_checkpoint
from trainer.config import TinyModelConfig, load_config
from trainer.modeling import Policy, load_policy
from trainer.optim import build_optimizer
from trainer.rollout import RolloutSettings
from trainer.step import StepContext, rl_step
from trainer.tiny_model import build_model
from trainer.tool_runners import SandboxRunner
from trainer.tools import format_tool_call
from trainer.toy_task import toy_problems

CONFIG = load_config(
    None,
    {
        "model": {"device": "cpu", "precision": "float32"},
        "rollout": {"group_size": 4, "oversample": 2, "prompts_per_step": 2},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "weight_decay": 0.0},
    },
)
SETTINGS = RolloutSettings(max_turns=3, max_response_tokens=200)


def noisy_solver(seed: int) -> Script:
    """Calls the tool (the value is a final expression: repl mode prints its repr), then boxes
    the printed value, or (half the time) that value plus one."""
    rng = random.Random(seed)

    def script(transcript: str, turn: int) -> str:
        if turn == 0:
            expression = re.findall(r"What is (.*?)\?", transcript)[-1]
            return format_tool_call(f"import sympy\nsympy.sympify('{expression}')")
        printed = int(re.findall(r"stdout: (-?\d+)", transcript)[-1])
        return f"<answer>\\boxed{{{printed + rng.choice([0, 1])}}}</answer>{EOS}"

    return script


class Recording(SandboxRunner):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.results: list[ExecuteResult] = []

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        results = await super().run(calls)
        self.results += results
        return results


def weights(policy: Policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])


def test_scripted_policy_through_the_service_roc_updates_and_resume(
    service: ServiceProcess, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    )
    policy = Policy(model, tokenizer, torch.device("cpu"), None)
    optimizer, schedule = build_optimizer(model, CONFIG.optim)
    backend = ScriptedBackend(tokenizer, noisy_solver(0))
    rng = random.Random(0)
    problems = toy_problems(6, seed=5)
    start = weights(policy)

    async def steps(runner: Recording, batches: list[list]) -> list[tuple[dict, list]]:
        out = []
        async with runner:
            for batch in batches:
                out.append(
                    await rl_step(
                        batch,
                        StepContext(policy, optimizer, backend, runner, CONFIG, SETTINGS, rng),
                    )
                )
                schedule.step()
        return out

    runner = Recording(service.url)
    done = asyncio.run(steps(runner, [problems[0:2], problems[2:4]]))

    # Every rollout's call ran in the service (sympy and all, in repl mode), and its output
    # came back.
    assert len(runner.results) == 2 * 2 * 8
    assert all(r.status.value == "ok" and r.stdout.strip().isdigit() for r in runner.results)
    for metrics, groups in done:
        assert metrics["tool_calls"] == 16 and metrics["tool_errors"] == 0
        assert 0.0 < metrics["time_tool_s"] < metrics["time_rollout_s"]  # the service's share
        assert metrics["roc_kept"] == 8  # two groups of 2G = 8 rollouts, G = 4 kept of each
        assert math.isfinite(metrics["loss"]) and metrics["trained_tokens"] > 0
        assert 0.0 < metrics["reward_mean"] < 1.0
        for group in groups:
            for scored in group:
                r = scored.rollout
                first_turn = r.loss_mask.index(0)
                tool_part = r.loss_mask[first_turn:].index(1) + first_turn
                assert decode(tokenizer, r.response_ids[:first_turn]).endswith("</tool_call>")
                assert "<tool_response>" in decode(tokenizer, r.response_ids[first_turn:tool_part])
                assert all(m == 1 for m in r.loss_mask[tool_part:])
    after_two = weights(policy)
    assert not torch.equal(start, after_two)

    # Checkpoint, then resume into fresh objects and take a third step.
    state = TrainState(step=2, stage_step=2)
    path = save_checkpoint(tmp_path, policy, optimizer, schedule, state, rng, keep=2)
    resumed = load_policy(CONFIG.model, path / "model")
    assert torch.equal(weights(resumed), after_two)
    optimizer2, schedule2 = build_optimizer(resumed.model, CONFIG.optim)
    rng2 = random.Random(123)
    state2 = load_training_state(path, optimizer2, schedule2, rng2)
    assert state2 == state and rng2.getstate() == rng.getstate()
    assert schedule2.get_last_lr() == schedule.get_last_lr()
    policy, optimizer, schedule, rng = resumed, optimizer2, schedule2, rng2
    [(metrics, _)] = asyncio.run(steps(Recording(service.url), [problems[4:6]]))
    assert math.isfinite(metrics["loss"])
    assert not torch.equal(weights(policy), after_two)
