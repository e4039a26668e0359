"""The policy sharded with PyTorch FSDP2: one ``fully_shard`` per decoder layer, then the root.

    torchrun --nproc-per-node 8 -m trainer.train --config ... --set model.fsdp=true  # docs/gpu.md

The same code runs on one process (world size 1, CPU or GPU) and on many; on CPU the
process group is gloo, on GPUs NCCL. What it sets up:

- Parameters are kept in float32 and sharded across ranks. On a GPU the forward and backward
  compute in bfloat16 and gradients are reduced in float32 (``MixedPrecisionPolicy``); on CPU
  everything stays float32 (bf16 matmuls are slow there and the tests compare numbers).
- Gradients are *summed* across ranks (divide factor 1, SUM reduction), not averaged:
  ``update.grpo_update`` already weights each rank's tokens by the whole mini-batch's count,
  so the sum is exactly the one-process gradient.
- Activation checkpointing (``model.gradient_checkpointing``) is transformers' non-reentrant
  per-layer checkpointing, applied before sharding. FSDP2 unshards a layer in its pre-backward
  hook, so recomputation finds its parameters gathered; parameter names are unchanged, which
  the weight push and ``save_pretrained`` rely on.
- Loading (``load_sharded_policy``): only rank 0 reads the weights, into CPU memory; every
  rank builds the model on the meta device, shards it, allocates only its shards, and
  receives them from rank 0, one tensor at a time (``set_model_state_dict`` with
  ``broadcast_from_rank0``). No GPU ever holds the whole model, and a node reads it once.
- A checkpoint's model is gathered to rank 0 on CPU (``get_model_state_dict`` with
  ``full_state_dict`` and ``cpu_offload``); the weight push gathers one parameter at a time
  instead (``weights.full_parameters``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from trainer.config import ModelConfig
from trainer.modeling import (
    Policy,
    enable_activation_checkpointing,
    load_model,
    prepare_policy,
    resolve_device,
)
from trainer.parallel import DataParallel


def init_distributed(device_type: str | None = None, timeout_s: float = 1800) -> DataParallel:
    """Join the process group ``torchrun`` describes (or a group of one without it) and pin this
    rank's GPU. NCCL where there are GPUs, gloo otherwise."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:  # one process, no launcher: an in-memory store is all a group of one needs
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DataParallel(dist.get_rank(), dist.get_world_size())


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks (``model.model.layers`` in transformers' causal LMs)."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard layer by layer")
    return list(layers)


def mixed_precision(device: torch.device) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction on GPUs with bf16; full fp32 elsewhere."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_policy(policy: Policy, activation_checkpointing: bool = False) -> Policy:
    """Shard ``policy.model`` in place over the default process group; the policy to train.

    The model must be on this rank's device already. The returned policy has no autocast:
    FSDP's mixed precision casts the parameters itself.
    """
    model = policy.model
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    mesh = init_device_mesh(policy.device.type, (dist.get_world_size(),))
    mp = mixed_precision(policy.device)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # A plain sum: a divide factor of 1 alone becomes PREMUL_SUM, which gloo lacks.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return Policy(model, policy.tokenizer, policy.device, None)


def load_sharded_policy(
    config: ModelConfig, path: str | Path | None, seed: int, dp: DataParallel
) -> Policy:
    """The policy of ``config`` (or of the directory ``path``) sharded over the default process
    group, its weights read by rank 0 alone (module docstring). Every rank must call it."""
    device = resolve_device(config.device)
    full = load_model(config, path, seed)[0] if dp.rank == 0 else None
    model, tokenizer = load_model(config, path, seed, empty=True)
    policy = shard_policy(prepare_policy(config, model, tokenizer, device))
    policy.model.to_empty(device=device)
    state = full.state_dict() if full is not None else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(policy.model, state, options=options)
    # Buffers are not sharded and some (rotary frequencies) are not in the state dict: to_empty
    # left them uninitialised; they are rank 0's, as built.
    for name, buffer in policy.model.named_buffers():
        if full is not None:
            buffer.copy_(full.get_buffer(name))
        if dp.distributed:
            dist.broadcast(buffer, src=0)
    return policy


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The whole model's state on rank 0's CPU (empty on other ranks). A collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state, keyed by parameter name, on rank 0's CPU. A collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Scatter a ``full_optimizer_state`` (read on every rank) back into the shards."""
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)


def save_pretrained(policy: Policy, directory: str | Path, dp: DataParallel) -> None:
    """``save_pretrained`` of a sharded policy, written by rank 0. Every rank must call it."""
    state = full_state_dict(policy.model)
    if dp.rank == 0:
        policy.model.save_pretrained(directory, state_dict=state)
        policy.tokenizer.save_pretrained(directory)
    if dp.distributed:
        dist.barrier()
