"""One RL step of GRPO-RoC: sample 2G rollouts per prompt, score, Resample-on-Correct, update.

The order is the report's: rewards on all ``oversample * G`` rollouts, RoC keeps ``G`` of
each group (dropping groups with no reward contrast), advantages are normalised within the
*kept* group, and only the kept rollouts enter the loss.

With several data-parallel ranks (``parallel.DataParallel``) each rank with its own engine
samples whole groups of its share of the problems, or rank 0 samples them all (a backend that
is not ``per_rank``; an ``EngineGroup``: on every rank's engine); every rank then holds every
group, runs the same RoC with the same generator, and takes its share of the update.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sandbox_service.models import Mode
from trainer.backends.base import GenerationBackend
from trainer.chat import prompt_text
from trainer.config import RewardConfig, TrainConfig
from trainer.engines import EngineGroup
from trainer.grpo import group_advantages
from trainer.modeling import Policy
from trainer.parallel import SINGLE, DataParallel
from trainer.placement import SchedulerSettings
from trainer.problems import Problem
from trainer.reward import reward
from trainer.roc import resample_on_correct
from trainer.rollout import Rollout, RolloutSettings, ToolRunner, generate_rollouts
from trainer.scheduler import DriverMeter
from trainer.tool_runners import TimedRunner
from trainer.tools import PromptStyle, user_prompt
from trainer.update import Sample, grpo_update


def prompt_ids(policy: Policy, problem: Problem, style: PromptStyle = "plain") -> list[int]:
    return policy.tokenizer.encode(
        prompt_text(user_prompt(problem.problem), style=style), add_special_tokens=False
    )


@dataclass
class Scored:
    rollout: Rollout
    reward: float


async def sample_and_score(
    problems: Sequence[Problem],
    per_problem: int,
    policy: Policy,
    backend: GenerationBackend | Sequence[GenerationBackend],
    runner: ToolRunner,
    settings: RolloutSettings,
    scoring: RewardConfig,
    meter: DriverMeter | None = None,
) -> list[list[Scored]]:
    """``per_problem`` scored rollouts of each problem, grouped by problem; ``backend``: one
    engine or several, as ``generate_rollouts`` takes them."""
    prompts = [
        prompt_ids(policy, p, settings.prompt_style) for p in problems for _ in range(per_problem)
    ]
    rollouts = await generate_rollouts(prompts, backend, policy.tokenizer, runner, settings, meter)
    groups = []
    for g, problem in enumerate(problems):
        group = rollouts[g * per_problem : (g + 1) * per_problem]
        groups.append(
            [
                Scored(
                    r,
                    reward(
                        r.model_text,
                        problem.answer,
                        truncated=r.truncated and scoring.zero_truncated,
                        require_answer_tag=scoring.require_answer_tag,
                    ),
                )
                for r in group
            ]
        )
    return groups


async def sample_groups(
    problems: Sequence[Problem],
    per_problem: int,
    policy: Policy,
    backend: GenerationBackend,
    runner: ToolRunner,
    settings: RolloutSettings,
    scoring: RewardConfig,
    dp: DataParallel = SINGLE,
    meter: DriverMeter | None = None,
) -> list[list[Scored]]:
    """``sample_and_score`` on every rank's engine (or rank 0's), the groups on every rank.
    An ``EngineGroup``: rank 0's scheduler places every turn on all ranks' engines."""

    async def sample(
        chosen: Sequence[Problem], engines: GenerationBackend | Sequence[GenerationBackend]
    ) -> list[list[Scored]]:
        return await sample_and_score(
            chosen, per_problem, policy, engines, runner, settings, scoring, meter
        )

    if isinstance(backend, EngineGroup):  # its ranks, whatever ``dp`` says (evaluation: none)
        groups = await backend.run(lambda engines: sample(problems, engines))
        return backend.dp.broadcast(groups) or []
    if not dp.distributed:
        return await sample(problems, backend)
    if backend.per_rank:
        return dp.gather_shares(await sample(dp.share(problems), backend))
    groups = await sample(problems, backend) if dp.rank == 0 else None
    return dp.broadcast(groups) or []


def rollout_settings(
    config: TrainConfig, max_turns: int, max_response_tokens: int
) -> RolloutSettings:
    return RolloutSettings(
        max_turns=max_turns,
        max_response_tokens=max_response_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        tool_timeout_s=config.tool.timeout_s,
        tool_memory_mb=config.tool.memory_mb,
        tool_mode=Mode(config.tool.mode),
        max_tool_response_chars=config.tool.max_response_chars,
        truncate_side=config.tool.truncate_side,
        scheduling=scheduler_settings(config),
        tool_batch_size=config.tool.batch_size,
        tool_batch_timeout_s=config.tool.batch_timeout_s,
        prompt_style=config.prompt.style,
    )


def scheduler_settings(config: TrainConfig) -> SchedulerSettings | None:
    """None for rounds; the asynchronous scheduler's settings otherwise."""
    rollout = config.rollout
    if rollout.scheduler == "rounds":
        return None
    return SchedulerSettings(rollout.scheduler, rollout.chunk_tokens, rollout.locality_wait_s)


def select(
    groups: list[list[Scored]], config: TrainConfig, rng: random.Random
) -> tuple[list[list[Scored]], dict[str, float]]:
    """G of each group: by RoC, or with it off uniformly at random (all-equal groups dropped
    when asked). The controls: RoC off with ``oversample: 1`` is GRPO on G rollouts; with
    ``oversample: 2``, 2G sampled and G kept at random; RoC on, G kept by RoC."""
    outcome = resample_on_correct(
        [[s.rollout.roc_sample(s.reward) for s in g] for g in groups],
        config.roc,
        config.rollout.group_size,
        rng,
    )
    kept = [[group[i] for i in idx] for group, idx in zip(groups, outcome.kept, strict=True) if idx]
    return kept, outcome.metrics


def to_samples(kept: list[list[Scored]], sampled_logprobs: bool = False) -> list[Sample]:
    """The kept rollouts as samples; ``sampled_logprobs``: with the engine's logprobs (only
    comparable with the trainer's when sampled at temperature 1 and top-p 1)."""
    samples = []
    for group in kept:
        advantages = group_advantages(torch.tensor([[s.reward for s in group]]))[0]  # (G,)
        for scored, advantage in zip(group, advantages.tolist(), strict=True):
            r = scored.rollout
            samples.append(
                Sample(
                    token_ids=r.prompt_ids + r.response_ids,
                    loss_mask=[0] * len(r.prompt_ids) + r.loss_mask,
                    advantage=advantage,
                    sampled_logprobs=[0.0] * len(r.prompt_ids) + r.logprobs
                    if sampled_logprobs
                    else None,
                )
            )
    return samples


@dataclass
class StepContext:
    """What the RL steps of a stage share: everything a step uses besides its problems.
    ``rollout``: the stage's rollout settings; ``rng``: RoC's and the update's generator
    (with several ranks, every rank holds the same state); ``reference``: the frozen policy of
    the KL term (``loss.kl_coef`` > 0)."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    backend: GenerationBackend
    runner: ToolRunner
    config: TrainConfig
    rollout: RolloutSettings
    rng: random.Random
    reference: Policy | None = None
    dp: DataParallel = SINGLE


async def rl_step(
    problems: Sequence[Problem], ctx: StepContext
) -> tuple[dict[str, float], list[list[Scored]]]:
    """One step on ``problems``; the step's metrics and every scored rollout (for logging).
    With several ranks, every rank calls it with the same problems and ``rng`` state."""
    config = ctx.config
    start = time.monotonic()
    per_problem = config.rollout.group_size * config.rollout.oversample
    tools = TimedRunner(ctx.runner)
    meter = DriverMeter()  # this rank's driver (rank 0's places all turns of an EngineGroup)
    groups = await sample_groups(
        problems,
        per_problem,
        ctx.policy,
        ctx.backend,
        tools,
        ctx.rollout,
        config.reward,
        ctx.dp,
        meter,
    )
    ctx.backend.offload()
    rolled = time.monotonic()
    kept, metrics = select(groups, config, ctx.rng)
    metrics.update(rollout_metrics([s for g in groups for s in g]))
    on_policy = ctx.rollout.temperature == 1 and ctx.rollout.top_p == 1
    samples = to_samples(kept, sampled_logprobs=on_policy)
    metrics.update(advantage_metrics(samples))
    if samples:
        metrics.update(
            grpo_update(
                ctx.policy,
                ctx.optimizer,
                samples,
                config.loss,
                config.optim,
                ctx.rng,
                ctx.reference,
                ctx.dp,
            )
        )
    else:  # every group was all-right or all-wrong: nothing to learn from this step
        metrics.update(
            dict.fromkeys(("loss", "clip_frac", "approx_kl", "entropy", "grad_norm"), 0.0)
        )
    updated = time.monotonic()
    ctx.backend.update_weights(ctx.policy.model, changed=bool(samples))
    metrics["time_push_s"] = time.monotonic() - updated
    metrics["updated"] = float(bool(samples))
    metrics["reward_kept_mean"] = sum(s.reward for g in kept for s in g) / max(
        1, sum(len(g) for g in kept)
    )
    metrics["time_rollout_s"] = rolled - start
    metrics["time_tool_s"] = tools.busy_s  # within time_rollout_s
    metrics.update(meter.metrics())
    metrics["time_update_s"] = updated - rolled
    return metrics, groups


def advantage_metrics(samples: list[Sample]) -> dict[str, float]:
    """Group-normalised advantages average 0 by construction; their spread says how much
    signal the step carries, and the extremes show lone successes or failures in a group."""
    if not samples:
        return {"adv_abs_mean": 0.0, "adv_max": 0.0, "adv_min": 0.0}
    advantages = [s.advantage for s in samples]
    return {
        "adv_abs_mean": sum(abs(a) for a in advantages) / len(advantages),
        "adv_max": max(advantages),
        "adv_min": min(advantages),
    }


def rollout_metrics(scored: list[Scored]) -> dict[str, float]:
    n = max(1, len(scored))
    calls = sum(s.rollout.tool_calls for s in scored)
    errors = sum(s.rollout.tool_errors for s in scored)
    return {
        "reward_mean": sum(s.reward for s in scored) / n,
        "tool_calls": float(calls),
        "tool_errors": float(errors),
        "tool_error_rate": errors / calls if calls else 0.0,
        "turns_mean": sum(s.rollout.turns for s in scored) / n,
        "response_tokens_mean": sum(len(s.rollout.response_ids) for s in scored) / n,
        "truncated_frac": sum(s.rollout.truncated for s in scored) / n,
        "rollouts": float(len(scored)),
    }
