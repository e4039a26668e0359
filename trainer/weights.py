"""The policy's full weights, one parameter (or one bounded bucket) at a time, for a push.

A sharded (FSDP) parameter is gathered with ``full_tensor()``, a collective every rank joins in
the same order, so all ranks iterate together even where only one sends. Nothing holds more
than the current bucket: peak memory is the bucket size (plus the largest parameter), never
the whole model. Tensors are cast to the engine's dtype on the way (bf16: half the bytes of
the trainer's fp32 master weights). Names are the module's ``named_parameters`` names, which
are the checkpoint names transformers writes and vLLM's ``load_weights`` reads; a tied
embedding appears once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

Named = tuple[str, torch.Tensor]


def full_parameters(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[Named]:
    """``(name, full tensor)`` of every parameter, in ``named_parameters`` order."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        full_tensor = getattr(tensor, "full_tensor", None)
        if callable(full_tensor):  # a DTensor shard: all-gather it
            tensor = full_tensor()
        yield name, tensor if dtype is None else tensor.to(dtype)


def buckets(pairs: Iterable[Named], bucket_bytes: int) -> Iterator[list[Named]]:
    """Consecutive pairs grouped up to ``bucket_bytes`` (a larger tensor goes alone)."""
    bucket: list[Named] = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def parameter_specs(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """Name, dtype (as sent) and full shape of every parameter, without gathering anything."""
    return [
        (name, dtype or param.dtype, tuple(param.shape))  # a DTensor's shape is the full one
        for name, param in model.named_parameters()
    ]
