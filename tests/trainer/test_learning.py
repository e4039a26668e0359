"""A tiny model trained with this GRPO-RoC step raises its reward on a toy task.

The task: the prompt says a digit, the reward is 1 when the reply ends (end of sequence, within
six tokens) and its last ``\\boxed{}`` is that digit. The vocabulary is eleven whole words
(``\\boxed{3}`` is one token), so a random policy succeeds now and then (a few percent) and
most groups have something to learn from.
Everything else is the real thing: transformers sampling, the rollout loop, math-verify
rewards, Resample-on-Correct, group advantages, the clipped token-mean loss and AdamW.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trainer.backends.hf import HFBackend
from trainer.config import TinyModelConfig, load_config
from trainer.modeling import Policy
from trainer.optim import build_optimizer
from trainer.problems import Problem
from trainer.rollout import RolloutSettings
from trainer.step import StepContext, rl_step
from trainer.tiny_model import build_model
from trainer.tool_runners import SubprocessRunner

DIGITS = list("1357")
WORDS = ["<|endoftext|>", "<|im_end|>", "say", *DIGITS, *(f"\\boxed{{{d}}}" for d in DIGITS)]
PROMPTS = [Problem(f"say {d}", d, d) for d in "1357"]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def test_mean_reward_rises_over_grpo_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = word_tokenizer()
    torch.manual_seed(0)
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    )
    policy = Policy(model, tokenizer, torch.device("cpu"), None)
    config = load_config(
        None,
        {
            "rollout": {"group_size": 8, "oversample": 2, "prompts_per_step": len(PROMPTS)},
            "optim": {"lr": 3e-2, "warmup_steps": 1, "weight_decay": 0.0},
        },
    )
    optimizer, _ = build_optimizer(model, config.optim)
    backend = HFBackend(model, tokenizer)
    settings = RolloutSettings(max_turns=1, max_response_tokens=6)
    # The prompt is the problem's words alone: this vocabulary has no chat markers.
    monkeypatch.setattr(
        "trainer.step.prompt_ids", lambda policy, problem, style: tokenizer.encode(problem.problem)
    )
    rng = random.Random(0)

    async def run(steps: int) -> list[float]:
        runner = SubprocessRunner()
        out = []
        for _ in range(steps):
            metrics, _ = await rl_step(
                PROMPTS, StepContext(policy, optimizer, backend, runner, config, settings, rng)
            )
            out.append(metrics["reward_mean"])
        return out

    rewards = asyncio.run(run(30))
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.25, rewards
    assert last > 0.5, rewards
