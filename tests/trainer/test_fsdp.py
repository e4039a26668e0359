"""fsdp.py on CPU over gloo: 2 ranks update exactly as 1 process, and gathers are exact.

Each case runs in spawned processes (a process group cannot be torn down cleanly inside the
test process): one unsharded process as the reference, FSDP with world size 1 (the same code
path as many ranks), and FSDP with 2 ranks. Every process builds the same seeded tiny model
and the same samples and takes one GRPO update; rank 0 writes what it saw.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from trainer.config import LossConfig, ModelConfig, OptimConfig, TinyModelConfig
from trainer.modeling import Policy
from trainer.tiny_model import build_model, build_tokenizer
from trainer.toy_task import tokenizer_corpus
from trainer.update import Sample, grpo_update
from trainer.weights import buckets, full_parameters

SHAPE = TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4)


def make_policy() -> Policy:
    tokenizer = build_tokenizer(tokenizer_corpus(64), vocab_size=512)
    torch.manual_seed(0)
    return Policy(build_model(tokenizer, SHAPE), tokenizer, torch.device("cpu"), None)


def make_samples(vocab: int) -> list[Sample]:
    """Seven samples of uneven lengths: two ranks get different numbers of micro-batches."""
    rng = random.Random(0)
    out = []
    for i, n in enumerate([9, 31, 5, 20, 11, 7, 16]):
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        mask = [0] * 3 + [rng.choice([0, 1, 1]) for _ in range(n - 3)]
        out.append(Sample(ids, mask, advantage=1.0 if i % 2 else -1.0))
    return out


def one_update(policy: Policy, checkpointing: bool = False) -> dict[str, Any]:
    from trainer.parallel import SINGLE, DataParallel

    dp = SINGLE
    if torch.distributed.is_initialized():
        from trainer.fsdp import shard_policy

        dp = DataParallel(torch.distributed.get_rank(), torch.distributed.get_world_size())
        policy = shard_policy(policy, activation_checkpointing=checkpointing)
    before = {name: t.clone() for name, t in full_parameters(policy.model)}
    # Momentum: state to checkpoint; its first step is plain SGD's, so gradients still show.
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5, momentum=0.9)
    loss, optim = LossConfig(), OptimConfig(micro_batch_tokens=40, grad_clip=0.05, mini_batches=2)
    samples = make_samples(len(policy.tokenizer))
    metrics = grpo_update(policy, optimizer, samples, loss, optim, random.Random(0), dp=dp)
    after = dict(full_parameters(policy.model))
    result = {"before": before, "after": after, "metrics": metrics}
    if dp.distributed:
        result["restored"] = restore(policy, optimizer, dp)
    return result


def restore(policy: Policy, optimizer: torch.optim.Optimizer, dp: Any) -> dict[str, Any]:
    """Gather model and optimizer state as a checkpoint does, load them into a fresh sharded
    policy and optimizer as a resume does, and gather those again."""
    from trainer import fsdp

    model_state = dp.broadcast(fsdp.full_state_dict(policy.model))  # written by rank 0, read by all
    optimizer_state = dp.broadcast(fsdp.full_optimizer_state(policy.model, optimizer))
    fresh = make_policy()
    fresh.model.load_state_dict(model_state)
    fresh = fsdp.shard_policy(fresh)
    fresh_optimizer = torch.optim.SGD(fresh.model.parameters(), lr=0.5, momentum=0.9)
    fsdp.load_full_optimizer_state(fresh.model, fresh_optimizer, optimizer_state)
    return {
        "model": dict(full_parameters(fresh.model)),
        "saved_optimizer": optimizer_state,
        "optimizer": fsdp.full_optimizer_state(fresh.model, fresh_optimizer),
    }


def worker(rank: int, world: int, port: int, out: str, checkpointing: bool) -> None:
    torch.set_num_threads(1)
    if world:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
        )
        from trainer.fsdp import init_distributed

        init_distributed("cpu")
    result = one_update(make_policy(), checkpointing)
    if rank == 0:
        torch.save(result, out)
    if world:
        leave_group()


def leave_group() -> None:
    """Wait for every rank, then exit without C++ teardown. A rank that outlived the store's
    host (rank 0) in ``destroy_process_group`` died with SIGABRT ("terminate called without an
    active exception") once in CI; what each rank has to say is on disk by now."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(world: int, tmp_path: Path, checkpointing: bool = False) -> dict[str, Any]:
    """world 0: one plain process; 1 or 2: FSDP ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / f"world{world}-{checkpointing}.pt")
    mp.spawn(worker, args=(world, port, out, checkpointing), nprocs=max(world, 1), join=True)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(0, tmp_path_factory.mktemp("fsdp"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(2, tmp_path_factory.mktemp("fsdp"))


def assert_same_update(result: dict[str, Any], reference: dict[str, Any]) -> None:
    assert result["metrics"]["loss"] == pytest.approx(reference["metrics"]["loss"], rel=1e-5)
    assert result["metrics"]["grad_norm"] == pytest.approx(
        reference["metrics"]["grad_norm"], rel=1e-5
    )
    for key in ("clip_frac", "approx_kl", "entropy", "trained_tokens"):
        assert result["metrics"][key] == pytest.approx(reference["metrics"][key], abs=1e-6)
    assert result["after"].keys() == reference["after"].keys()
    moved = 0
    for name, tensor in reference["after"].items():
        torch.testing.assert_close(result["after"][name], tensor, rtol=1e-5, atol=1e-6)
        moved += not torch.equal(tensor, reference["before"][name])
    assert moved == len(reference["after"])  # every parameter took part in the step


def test_two_ranks_update_as_one_process(
    reference: dict[str, Any], two_ranks: dict[str, Any]
) -> None:
    assert_same_update(two_ranks, reference)


def test_world_size_one_and_checkpointing_update_as_one_process(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    assert_same_update(run(1, tmp_path, checkpointing=True), reference)


def test_gathered_parameters_are_the_unsharded_model(two_ranks: dict[str, Any]) -> None:
    """Before the step, rank 0 gathered each sharded parameter: it is the seeded model's own."""
    sharded = two_ranks
    plain = make_policy()
    names = [name for name, _ in plain.model.named_parameters()]
    assert list(sharded["before"]) == names  # same names, same order: what the push sends
    for name, param in plain.model.named_parameters():
        assert torch.equal(sharded["before"][name], param.detach())


def test_checkpoint_states_gather_and_scatter_back(two_ranks: dict[str, Any]) -> None:
    restored = two_ranks["restored"]
    for name, tensor in two_ranks["after"].items():
        assert torch.equal(restored["model"][name], tensor)
    saved, again = restored["saved_optimizer"]["state"], restored["optimizer"]["state"]
    assert saved.keys() == again.keys() == two_ranks["after"].keys()  # keyed by name
    for name in saved:
        assert torch.equal(saved[name]["momentum_buffer"], again[name]["momentum_buffer"])


def load_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    """Rank ``rank`` of 2 loads the saved policy sharded and writes what it holds."""
    from trainer.fsdp import init_distributed, load_sharded_policy

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    dp = init_distributed("cpu")
    policy = load_sharded_policy(ModelConfig(path=model_dir, device="cpu"), None, 0, dp)
    meta = [
        name
        for name, p in policy.model.named_parameters()
        if p.to_local().is_meta  # type: ignore[attr-defined]  # a DTensor once sharded
    ]
    ids = torch.tensor([[3, 17, 42, 7, 99, 5]])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits
    result = {
        "parameters": dict(full_parameters(policy.model)),
        "buffers": {name: b.clone() for name, b in policy.model.named_buffers()},
        "logits": logits,
        "meta": meta,
        "training": policy.model.training,
    }
    torch.save(result, out.format(rank=rank))
    leave_group()


def test_sharded_load_reads_weights_on_rank_zero_only_and_matches_the_model(
    tmp_path: Path,
) -> None:
    """Ranks build the model on the meta device and get their shards from rank 0: the sharded
    model is the saved one, buffers (rotary frequencies, not in the state dict) included."""
    from trainer.modeling import load_model

    plain = make_policy()
    plain.save(tmp_path / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "loaded-{rank}.pt")
    mp.spawn(load_worker, args=(port, str(tmp_path / "model"), out), nprocs=2, join=True)
    with torch.no_grad():
        expected = plain.model(input_ids=torch.tensor([[3, 17, 42, 7, 99, 5]])).logits
    names = [name for name, _ in plain.model.named_parameters()]
    buffers = dict(plain.model.named_buffers())
    assert buffers
    for rank in range(2):
        loaded = torch.load(out.format(rank=rank), weights_only=False)
        assert loaded["meta"] == [] and loaded["training"]
        assert list(loaded["parameters"]) == names
        for name, param in plain.model.named_parameters():
            assert torch.equal(loaded["parameters"][name], param.detach())
        assert loaded["buffers"].keys() == buffers.keys()
        for name, buffer in buffers.items():
            assert torch.equal(loaded["buffers"][name], buffer), (rank, name)
        torch.testing.assert_close(loaded["logits"], expected, rtol=1e-5, atol=1e-5)
    empty, _ = load_model(ModelConfig(path=str(tmp_path / "model")), empty=True)
    assert all(p.is_meta for p in empty.parameters())  # the other ranks read no weights


def test_buckets_bound_their_size() -> None:
    pairs = [(f"p{i}", torch.zeros(n)) for i, n in enumerate([10, 20, 5, 100, 1, 1])]
    groups = list(buckets(pairs, bucket_bytes=30 * 4))
    assert [[name for name, _ in g] for g in groups] == [["p0", "p1"], ["p2"], ["p3"], ["p4", "p5"]]
    assert [n for g in groups for n, _ in g] == [n for n, _ in pairs]


def train_worker(rank: int, output: str, max_steps: int) -> None:
    """train() with model.fsdp on one process, as torchrun would start rank 0 of one."""
    import asyncio

    from trainer.config import load_config
    from trainer.train import train

    torch.set_num_threads(1)
    overrides = {
        "model": {"fsdp": True, "device": "cpu", "tiny": {"vocab_size": 512, "hidden_size": 32}},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_turns": 2},
        "rollout.max_response_tokens": 32,
        "stages": [{"name": "toy", "steps": 3}],
        "checkpoint": {"every": 2, "keep": 5},
        "logging.progress": False,
        "sft.enabled": False,
    }
    config = load_config(Path(__file__).parents[2] / "trainer/configs/tiny_cpu.yaml", overrides)
    asyncio.run(train(config, output, sandbox_url="subprocess", max_steps=max_steps))
    torch.distributed.destroy_process_group()


def test_train_shards_checkpoints_and_resumes_on_one_process(tmp_path: Path) -> None:
    from trainer.checkpoint import checkpoints

    mp.spawn(train_worker, args=(str(tmp_path), 2), nprocs=1, join=True)
    mp.spawn(train_worker, args=(str(tmp_path), 5), nprocs=1, join=True)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    restored = torch.load(checkpoints(tmp_path)[-1] / "trainer.pt", weights_only=False)
    assert restored["state"]["step"] == 3 and "state" in restored["optimizer"]


def sft_worker(rank: int, world: int, port: int, config: str, output: str) -> None:
    """``python -m trainer.sft`` as one of ``world`` torchrun ranks."""
    from trainer.sft import main

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    main(["--config", config, "--output", output])
    leave_group()


def test_sharded_sft_trains_as_one_process_does(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    from trainer.sft import main

    shape = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
    overrides: dict[str, dict[str, Any]] = {
        "model": {"path": "tiny", "device": "cpu", "precision": "float32", "tiny": shape},
        "sft": {"toy_transcripts": 16, "steps": 3, "batch_size": 5, "warmup_steps": 1},
        "optim": {"micro_batch_tokens": 400},  # several micro-batches, uneven between ranks
    }
    plain, sharded = tmp_path / "plain.yaml", tmp_path / "sharded.yaml"
    plain.write_text(yaml.safe_dump(overrides))
    sharded.write_text(yaml.safe_dump({**overrides, "model": {**overrides["model"], "fsdp": True}}))
    main(["--config", str(plain), "--output", str(tmp_path / "one")])
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["last_loss"] < summary["first_loss"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (2, port, str(sharded), str(tmp_path / "two"))
    mp.spawn(sft_worker, args=args, nprocs=2, join=True)
    [line] = [x for x in capfd.readouterr().out.splitlines() if x.startswith("{")]  # rank 0's
    assert json.loads(line) == pytest.approx(summary, rel=1e-5)  # each token counted once
    one = load_file(tmp_path / "one" / "model.safetensors")
    two = load_file(tmp_path / "two" / "model.safetensors")  # also the tied lm_head, gathered
    assert one.keys() <= two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5)
