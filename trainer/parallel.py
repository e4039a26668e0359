"""Which data-parallel rank this process is, and the few collectives an RL step needs.

One process (``DataParallel()``, the default everywhere) needs no ``torch.distributed`` at
all. Under ``torchrun`` every rank holds the whole step's samples, trains on its share of
each mini-batch and sums, so the update equals one process's (see ``update.grpo_update``);
rollouts are generated where the engines are and gathered so that every rank runs the same
Resample-on-Correct with the same generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world: int = 1

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every ``world``-th, from ``rank``."""
        return list(items[self.rank :: self.world])

    def gather_shares(self, mine: Sequence[T]) -> list[T]:
        """Every rank's ``share`` put back in the order of the whole sequence."""
        if not self.distributed:
            return list(mine)
        shares: list[list[T] | None] = [None] * self.world
        dist.all_gather_object(shares, list(mine))
        out: list[T] = []
        for i in range(max(len(s or []) for s in shares)):
            out.extend(s[i] for s in shares if s is not None and i < len(s))
        return out

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        if not self.distributed:
            return [value]
        values: list[T | None] = [None] * self.world
        dist.all_gather_object(values, value)
        return values  # type: ignore[return-value]

    def broadcast(self, value: T, src: int = 0) -> T:
        """``value`` of rank ``src`` on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_reduce_sum(self, values: Sequence[float], device: torch.device) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()


SINGLE = DataParallel()  # one process: the default wherever a DataParallel is taken
