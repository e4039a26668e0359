"""configs/learn_cpu.yaml, shortened: GRPO-RoC raises the reward of the SFT-warmed tiny model.

The whole command is the trainer's (``train``), with every tool call executed by a real
embedded sandbox service. The warm start (SFT until the held-out answers copy the tool's number)
leaves the model calling the tool about half the time, and wrong nearly always when it does
not; the RL steps must raise the mean reward of the last steps above that of the first ones by
``MARGIN``, chosen from the spread measured over seeds (docs/trainer.md), not from one lucky
seed. The test runs seed 0 (the config's; its warm start: 2,300 tool-only SFT steps, then the
300 mixed ones).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.train import train

CONFIG = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "learn_cpu.yaml"
SHORT = {"stages": [{"name": "learn", "steps": 10}], "logging.progress": False, "eval.every": 0}
FIRST_LAST = 3  # steps averaged at each end
MARGIN = 0.1  # seeds 0-4 gained 0.17-0.42 over these ten steps (seed 0: 0.27, docs/trainer.md)


@pytest.mark.timeout(600)
def test_grpo_roc_raises_the_reward_with_the_real_sandbox(tmp_path: Path) -> None:
    history = asyncio.run(train(load_config(CONFIG, SHORT), tmp_path, progress=False))
    rewards = [h["reward_mean"] for h in history]
    before = sum(rewards[:FIRST_LAST]) / FIRST_LAST
    after = sum(rewards[-FIRST_LAST:]) / FIRST_LAST
    assert after > before + MARGIN, rewards
    calls = [h["tool_calls"] / h["rollouts"] for h in history]
    assert calls[-1] > calls[0], calls  # by calling the tool more often
    assert all(h["updated"] for h in history)
