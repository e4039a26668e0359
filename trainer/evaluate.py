"""Evaluation with the training agent loop: pass@1 averaged over k samples per problem.

    python -m trainer.evaluate --model runs/x/checkpoints/step_000020/model \\
        --data problems.jsonl --k 4 [--sandbox-url http://host:8000] [--config cfg.yaml]

Every problem is rolled out ``k`` times (temperature from the config; ``--greedy`` for 0) with
the same tool loop as training; pass@1 is the mean over problems of (correct / k). Writes one
JSON summary line to stdout and, with ``--output``, every rollout's text and verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from trainer.backends.base import GenerationBackend
from trainer.backends.hf import HFBackend
from trainer.config import TrainConfig, load_config
from trainer.modeling import Policy, load_policy
from trainer.parallel import SINGLE, DataParallel
from trainer.problems import Problem, load_problems
from trainer.rollout import RolloutSettings, ToolRunner
from trainer.step import Scored, rollout_metrics, rollout_settings, sample_groups
from trainer.tool_runners import open_runner
from trainer.toy_task import SHIPPED, heldout_problems

TOY, TOY_HELDOUT = "toy", "toy-heldout"


def problems_of(source: str) -> list[Problem]:
    """The problems of a JSONL/parquet file; ``toy``: the shipped toy set; ``toy-heldout``: 64
    toy problems outside it (evaluation while training on the toy task)."""
    if source == TOY_HELDOUT:
        return heldout_problems()
    return load_problems(SHIPPED if source == TOY else source)


async def correct_counts(
    problems: Sequence[Problem],
    k: int,
    policy: Policy,
    runner: ToolRunner,
    settings: RolloutSettings,
    config: TrainConfig,
    backend: GenerationBackend | None = None,
    dp: DataParallel = SINGLE,
) -> tuple[list[int], list[list[Scored]]]:
    """How many of ``k`` rollouts of each problem were correct (and the rollouts). Without a
    ``backend``, transformers generates from ``policy``; with ranks, on every rank alike."""
    if backend is None:
        backend = HFBackend(policy.model, policy.tokenizer, config.rollout.max_batch)
    groups: list[list[Scored]] = []
    chunk = max(1, config.rollout.max_batch // k)
    for start in range(0, len(problems), chunk):
        groups += await sample_groups(
            problems[start : start + chunk],
            k,
            policy,
            backend,
            runner,
            settings,
            config.reward,
            dp,
        )
    return [sum(s.reward > 0 for s in g) for g in groups], groups


def eval_metrics(counts: Sequence[int], k: int, groups: list[list[Scored]]) -> dict[str, float]:
    """``summary`` as the training metrics name it: ``eval_pass_rate`` is avg@k (the mean over
    problems of correct / k), ``eval_pass_at_k`` the share solved at least once."""
    s = summary(counts, k, groups)
    calls = s["tool_calls"] / s["rollouts"] if s["rollouts"] else 0.0
    return {
        "eval_pass_rate": s["pass@1"],
        "eval_pass_at_k": s["pass@k"],
        "eval_k": float(k),
        "eval_problems": s["problems"],
        "eval_tool_calls_per_rollout": calls,
        "eval_truncated_frac": s["truncated_frac"],
    }


def summary(counts: Sequence[int], k: int, groups: list[list[Scored]]) -> dict[str, float]:
    out = {"problems": float(len(counts)), "k": float(k)}
    out["pass@1"] = sum(c / k for c in counts) / max(1, len(counts))
    out["pass@k"] = sum(c > 0 for c in counts) / max(1, len(counts))
    out.update(rollout_metrics([s for g in groups for s in g]))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="training config: rollout and tool settings, model shape")
    parser.add_argument("--model", help="model directory (default: the config's model.path)")
    parser.add_argument(
        "--data",
        help="JSONL/parquet of {problem, answer}; toy: shipped set (default: the config's "
        "data.eval, else toy)",
    )
    parser.add_argument("--k", type=int, default=4, help="samples per problem")
    parser.add_argument("--limit", type=int, help="evaluate the first N problems only")
    parser.add_argument("--greedy", action="store_true", help="temperature 0")
    parser.add_argument("--sandbox-url", help="sandbox service URL; 'subprocess' for no sandbox")
    parser.add_argument("--output", help="JSONL file for every rollout and its verdict")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    torch.manual_seed(config.seed)
    policy = load_policy(config.model, args.model, seed=config.seed)
    problems = problems_of(args.data or config.data.eval or TOY)[: args.limit]
    stage = config.stages[-1]
    settings = rollout_settings(
        config,
        stage.max_turns or config.rollout.max_turns,
        stage.max_response_tokens or config.rollout.max_response_tokens,
    )
    if args.greedy:
        settings = replace(settings, temperature=0.0)

    async def run() -> tuple[list[int], list[list[Scored]]]:
        async with open_runner(args.sandbox_url or config.tool.sandbox_url) as runner:
            return await correct_counts(problems, args.k, policy, runner, settings, config)

    counts, groups = asyncio.run(run())
    if args.output:
        with Path(args.output).open("w") as f:
            for problem, group in zip(problems, groups, strict=True):
                for s in group:
                    row = {"id": problem.id, "reward": s.reward, "text": s.rollout.model_text}
                    f.write(json.dumps(row) + "\n")
    print(json.dumps(summary(counts, args.k, groups)))


if __name__ == "__main__":
    main()
