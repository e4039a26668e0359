"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a directory ``step_000012/`` under ``OUTPUT/checkpoints/`` holding the model
and tokenizer (``model/``, ``save_pretrained``: a path the trainer and transformers can load),
and ``trainer.pt`` with the optimizer and schedule, the training state (step, stage, data
position, stage-3 problem set) and every random generator the run draws from (torch, CUDA, the
trainer's own); with a KL term, also the reference policy (``reference/``): the starting
policy or, after a stage change that resets it, the policy at that change. It is written to a
temporary name and renamed, so a crash mid-write leaves the previous checkpoint as the latest.

A sharded (FSDP) run gathers the model and optimizer state to rank 0 first (``fsdp.py``) and
passes them in; rank 0 alone writes, and on resume every rank scatters the optimizer state back
with ``load_optimizer``.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.modeling import Policy

PREFIX = "step_"


@dataclass
class TrainState:
    step: int = 0  # RL steps done
    stage: int = 0  # index of the current stage
    stage_step: int = 0  # steps done in the current stage
    sampler: dict[str, int] = field(default_factory=dict)  # the stage's ProblemSampler state
    stage_problem_ids: list[str] | None = None  # stage 3's filtered problems, once chosen
    sft_done: bool = False


def checkpoint_root(output: str | Path) -> Path:
    return Path(output) / "checkpoints"


def save_checkpoint(
    output: str | Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    state: TrainState,
    rng: random.Random,
    keep: int,
    model_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    reference: Policy | None = None,
) -> Path:
    """Write a checkpoint; ``model_state`` / ``optimizer_state``: gathered full states that
    replace the module's and the optimizer's own (a sharded run's); ``reference``: the
    reference policy, when the run has one."""
    root = checkpoint_root(output)
    final = root / f"{PREFIX}{state.step:06d}"
    partial = root / f".partial-{final.name}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if model_state is None:
        policy.save(partial / "model")
    else:
        policy.model.save_pretrained(partial / "model", state_dict=model_state)
        policy.tokenizer.save_pretrained(partial / "model")
    if reference is not None:
        reference.save(partial / "reference")
    torch.save(
        {
            "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
            "schedule": schedule.state_dict(),
            "state": asdict(state),
            "rng": {
                "torch": torch.random.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "trainer": rng.getstate(),
            },
        },
        partial / "trainer.pt",
    )
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in checkpoints(output)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(output: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(output)
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "trainer.pt").exists()
    )


def latest_checkpoint(output: str | Path) -> Path | None:
    found = checkpoints(output)
    return found[-1] if found else None


def load_training_state(
    path: Path,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    rng: random.Random,
    load_optimizer: Callable[[dict[str, Any]], None] | None = None,
) -> TrainState:
    """Restore optimizer, schedule and generators from ``path``; the model is loaded from
    ``path / "model"`` with ``modeling.load_policy`` before the optimizer is built.
    ``load_optimizer`` replaces ``optimizer.load_state_dict`` (a sharded run's)."""
    saved: dict[str, Any] = torch.load(path / "trainer.pt", weights_only=False)
    (load_optimizer or optimizer.load_state_dict)(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    torch.random.set_rng_state(saved["rng"]["torch"])
    if saved["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
    rng.setstate(saved["rng"]["trainer"])
    return TrainState(**saved["state"])
