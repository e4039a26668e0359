"""bench_scheduler.py without vLLM: a setup's step and the summary, on scripted engines.

The benchmark itself runs on vLLM's CPU build (``python -m trainer.bench_scheduler``; figures
in docs/trainer.md); here its step runs on the toy task's scripted solver with real tool
calls in subprocesses.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from trainer.backends.scripted import ScriptedBackend
from trainer.bench_scheduler import SETUPS, one_step, summary
from trainer.modeling import Policy
from trainer.tool_runners import SubprocessRunner
from trainer.toy_task import scripted_solver, toy_problems


@pytest.mark.parametrize("name", list(SETUPS))
def test_a_setups_step_runs_every_rollout_on_both_engines(
    tokenizer: PreTrainedTokenizerFast, name: str
) -> None:
    engines = [ScriptedBackend(tokenizer, scripted_solver) for _ in range(2)]
    policy = Policy(None, tokenizer, torch.device("cpu"), None)  # type: ignore[arg-type]
    result = asyncio.run(
        one_step(SETUPS[name], engines, policy, toy_problems(3, seed=1), 2, SubprocessRunner(2))  # type: ignore[arg-type]
    )
    assert (result["turns"], result["tool_calls"], result["reward_mean"]) == (12, 6, 1.0)
    assert result["engines"] == 2 and all(e.calls for e in engines)
    assert 0 <= result["engine_idle_s"] <= result["wall_s"] and result["tool_wait_s"] > 0


def test_the_summary_is_static_over_balanced() -> None:
    rows = [
        {"setup": "static+sync", "wall_s": 3.0},
        {"setup": "static+sync", "wall_s": 5.0},
        {"setup": "balanced+async", "wall_s": 2.0},
    ]
    assert summary(rows) == {"static+sync": 4.0, "balanced+async": 2.0, "speedup": 2.0}
