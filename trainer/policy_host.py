"""Where the policy lives: in this process (``LocalHost``) or sharded over the ranks with FSDP2
(``ShardedHost``, ``model.fsdp``). The trainer and the SFT command load, save and checkpoint
through the host; only ``policy_host`` reads ``model.fsdp``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.config import ModelConfig
from trainer.modeling import Policy, load_policy
from trainer.parallel import SINGLE, DataParallel


class PolicyHost(Protocol):
    dp: DataParallel
    keeps_reference: bool  # checkpoints carry the reference policy (not yet when sharded)

    def load(self, config: ModelConfig, path: str | Path | None, seed: int) -> Policy:
        """The policy of ``config``, or of the directory ``path``; every rank calls it."""
        ...

    def save_pretrained(self, policy: Policy, directory: str | Path) -> None:
        """The whole model as a ``from_pretrained`` directory; every rank calls it."""
        ...

    def checkpoint_states(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> dict[str, dict[str, Any]]:
        """Gathered full states for ``checkpoint.save_checkpoint`` (none: its own); every rank
        calls it."""
        ...

    def optimizer_loader(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> Callable[[dict[str, Any]], None] | None:
        """What restores a checkpoint's optimizer state (None: ``load_state_dict``)."""
        ...


class LocalHost:
    """The whole policy in this process."""

    dp = SINGLE
    keeps_reference = True

    def load(self, config: ModelConfig, path: str | Path | None, seed: int) -> Policy:
        return load_policy(config, path, seed=seed)

    def save_pretrained(self, policy: Policy, directory: str | Path) -> None:
        policy.save(directory)

    def checkpoint_states(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> dict[str, dict[str, Any]]:
        return {}

    def optimizer_loader(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> Callable[[dict[str, Any]], None] | None:
        return None


class ShardedHost:
    """The policy sharded over the ranks of ``dp`` (``trainer.fsdp``)."""

    keeps_reference = False

    def __init__(self, dp: DataParallel) -> None:
        self.dp = dp

    def load(self, config: ModelConfig, path: str | Path | None, seed: int) -> Policy:
        from trainer import fsdp

        return fsdp.load_sharded_policy(config, path, seed, self.dp)

    def save_pretrained(self, policy: Policy, directory: str | Path) -> None:
        from trainer import fsdp

        fsdp.save_pretrained(policy, directory, self.dp)

    def checkpoint_states(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> dict[str, dict[str, Any]]:
        from trainer import fsdp

        return {
            "model_state": fsdp.full_state_dict(policy.model),
            "optimizer_state": fsdp.full_optimizer_state(policy.model, optimizer),
        }

    def optimizer_loader(
        self, policy: Policy, optimizer: torch.optim.Optimizer
    ) -> Callable[[dict[str, Any]], None] | None:
        from trainer import fsdp

        return lambda state: fsdp.load_full_optimizer_state(policy.model, optimizer, state)


def policy_host(config: ModelConfig) -> PolicyHost:
    """The host ``model.fsdp`` asks for; a sharded one joins (or starts) the process group."""
    if not config.fsdp:
        return LocalHost()
    from trainer import fsdp

    return ShardedHost(fsdp.init_distributed(config.device if config.device != "auto" else None))
