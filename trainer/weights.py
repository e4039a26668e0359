"""The policy's full weights, one parameter (or one bounded bucket) at a time, for a push.

A sharded (FSDP) parameter is gathered with ``full_tensor()``, a collective every rank joins in
the same order, so all ranks iterate together even where only one sends. Nothing holds more
than the current bucket: peak memory is the bucket size (plus the largest parameter), never
the whole model. Tensors are cast to the engine's dtype on the way (bf16: half the bytes of
the trainer's fp32 master weights). Names are the module's ``named_parameters`` names, which
are the checkpoint names transformers writes and vLLM's ``load_weights`` reads. A tied weight
(the input embedding shared with the LM head) appears once, or, with ``aliases``, under each
of its names: what a push sends, because vLLM's layerwise reload, which its weight-transfer
backends run, unties the head from the embedding, and a head not sent by name keeps its old
weights (seen with vLLM 0.32 on CPU, whose Qwen2 ties and loads as 0.33's does: the engine's
logprobs stayed off the pushed policy's until ``lm_head.weight`` was sent too).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

Named = tuple[str, torch.Tensor]


def full_parameters(
    model: torch.nn.Module, dtype: torch.dtype | None = None, aliases: bool = False
) -> Iterator[Named]:
    """``(name, full tensor)`` of every parameter, in ``named_parameters`` order; with
    ``aliases``, a tied one under each name (gathered again: memory stays one tensor)."""
    for name, param in model.named_parameters(remove_duplicate=not aliases):
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
    model: torch.nn.Module, dtype: torch.dtype | None = None, aliases: bool = False
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """Name, dtype (as sent) and full shape of every parameter, without gathering anything:
    ``full_parameters``' names, in its order."""
    return [
        (name, dtype or param.dtype, tuple(param.shape))  # a DTensor's shape is the full one
        for name, param in model.named_parameters(remove_duplicate=not aliases)
    ]
