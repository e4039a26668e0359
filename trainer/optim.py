"""AdamW with a linear warm-up to a constant learning rate (the report: 1e-6 after 20 steps)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import OptimConfig


def build_optimizer(
    model: torch.nn.Module, config: OptimConfig
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """The optimizer and its schedule. The trainer steps the schedule once per RL step that
    updated the policy (not per micro- or mini-batch), so ``warmup_steps`` counts what the
    report counts."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
    )
    warmup = max(1, config.warmup_steps)
    return optimizer, LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))


def reset_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget every parameter's moments and step count, as a fresh optimizer would have them;
    the learning rate (the schedule's) is kept."""
    optimizer.state.clear()
