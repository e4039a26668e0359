"""train.py's stage change: the report resets the optimizer state and the reference policy before
stage 3; a resumed run does the reset once, and only when the stage asks for it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.backends.scripted import Script, ScriptedBackend
from trainer.config import TrainConfig, load_config
from trainer.modeling import Policy
from trainer.tool_runners import SubprocessRunner
from trainer.toy_task import scripted_solver
from trainer.train import Trainer

CONFIG = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "tiny_cpu.yaml"


def micro(reset: bool) -> TrainConfig:
    return load_config(
        CONFIG,
        {
            "model.tiny": {
                "vocab_size": 512,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_layers": 1,
            },
            "rollout": {
                "group_size": 2,
                "oversample": 2,
                "prompts_per_step": 2,
                "max_turns": 2,
                "max_response_tokens": 200,
            },
            "loss.kl_coef": 0.1,  # a reference policy exists
            "optim": {"lr": 1e-2, "warmup_steps": 1, "weight_decay": 0.0},
            "sft.enabled": False,
            "stages": [
                {"name": "a", "steps": 2},
                {"name": "b", "steps": 2, "reset_optimizer": reset, "reset_reference": reset},
            ],
            "checkpoint": {"every": 1, "keep": 5},
            "logging.progress": False,
        },
    )


def coin_solver(seed: int) -> Script:
    """The toy task done right, but half the final answers get a digit too many: every group
    has right and wrong rollouts, so every step updates the policy."""
    rng = random.Random(seed)

    def script(transcript: str, turn: int) -> str:
        text = scripted_solver(transcript, turn)
        return text.replace("}</answer>", rng.choice(["", "0"]) + "}</answer>")

    return script


def scripted_trainer(config: TrainConfig, output: Path) -> Trainer:
    trainer = Trainer(config, output, resume=True, progress=False)
    backend = ScriptedBackend(trainer.policy.tokenizer, coin_solver(len(list(output.iterdir()))))
    trainer.make_backend = lambda: backend  # type: ignore[method-assign]
    return trainer


def run(trainer: Trainer, steps: int) -> list[dict[str, object]]:
    async def go() -> list[dict[str, object]]:
        return await trainer.run(SubprocessRunner(), steps)

    return asyncio.run(go())


def weights(policy: Policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])


def adam_steps(trainer: Trainer) -> set[float]:
    return {float(s["step"]) for s in trainer.optimizer.state.values()}


@pytest.mark.parametrize("reset", [True, False])
def test_stage_change_resets_optimizer_and_reference_when_asked(
    tmp_path: Path, reset: bool
) -> None:
    trainer = scripted_trainer(micro(reset), tmp_path)
    start = weights(trainer.policy)
    history = run(trainer, 2)  # all of stage a, then the stage change
    assert [h["stage"] for h in history] == ["a", "a"]
    assert all(h["updated"] == 1.0 for h in history)
    assert trainer.state.stage == 1
    now = weights(trainer.policy)
    assert not torch.equal(now, start)
    assert trainer.reference is not None
    if reset:
        assert trainer.optimizer.state == {}  # fresh moments and step counts
        assert torch.equal(weights(trainer.reference), now)
    else:
        assert adam_steps(trainer) == {2.0}
        assert torch.equal(weights(trainer.reference), start)
    lr = trainer.schedule.get_last_lr()

    [line] = run(trainer, 1)
    assert line["stage"] == "b" and line["lr"] == lr[0]  # the schedule goes on either way
    assert adam_steps(trainer) == ({1.0} if reset else {3.0})


def test_a_run_resumed_at_the_stage_change_resets_once(tmp_path: Path) -> None:
    config = micro(reset=True)
    first = scripted_trainer(config, tmp_path)
    run(first, 2)  # stage a's last checkpoint (step 2) was written before the change
    resumed = scripted_trainer(config, tmp_path)
    assert (resumed.state.stage, resumed.state.stage_step) == (0, 2)
    assert adam_steps(resumed) == {2.0}  # the checkpoint's optimizer, before the reset
    [line] = run(resumed, 1)
    assert line["stage"] == "b" and line["step"] == 3
    assert adam_steps(resumed) == {1.0}
    assert resumed.reference is not None


def test_the_reference_set_at_the_stage_change_survives_a_resume(tmp_path: Path) -> None:
    config = micro(reset=True)
    first = scripted_trainer(config, tmp_path)
    run(first, 3)  # stage a, the change, one step of stage b: checkpoint 3
    assert first.reference is not None
    at_change = load_file(tmp_path / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    resumed = scripted_trainer(config, tmp_path)
    assert resumed.state.step == 3 and resumed.reference is not None
    reference = dict(resumed.reference.model.named_parameters())
    assert all(torch.equal(reference[k], v) for k, v in at_change.items() if k in reference)
    assert torch.equal(weights(resumed.reference), weights(first.reference))
    assert not torch.equal(weights(resumed.reference), weights(resumed.policy))
