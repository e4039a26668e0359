"""GRPO-RoC training: optional SFT warm start, then the RL stages, on one process or many.

    python -m trainer.train --config trainer/configs/tiny_cpu.yaml --output runs/tiny \\
        [--sandbox-url http://host:8000 | subprocess] [--set optim.lr=2e-6 ...] [--max-steps N]
    torchrun --nproc-per-node 8 -m trainer.train --config ... --set model.fsdp=true \\
        --set rollout.backend=vllm ...                     # GPUs: docs/gpu.md

With ``model.fsdp`` the policy is sharded with FSDP2 across the ``torchrun`` ranks (or one
process); every rank runs the same steps, rank 0 alone writes metrics and checkpoints.

Without ``--sandbox-url`` (or ``tool.sandbox_url``) an embedded sandbox service is started for
the run. ``OUTPUT/metrics.jsonl`` gets one line per RL step; ``OUTPUT/config.yaml`` the
resolved config; ``OUTPUT/checkpoints/`` the checkpoints. Run the same command again and it
resumes from the newest checkpoint (``--no-resume`` to refuse).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from trainer.backends.base import GenerationBackend
from trainer.backends.hf import HFBackend
from trainer.checkpoint import TrainState, latest_checkpoint, load_training_state, save_checkpoint
from trainer.config import StageConfig, TrainConfig, load_config, save_config
from trainer.engines import EngineGroup
from trainer.evaluate import correct_counts, eval_metrics, problems_of
from trainer.modeling import Policy, load_policy
from trainer.optim import build_optimizer, reset_optimizer_state
from trainer.parallel import SINGLE, DataParallel
from trainer.policy_host import policy_host
from trainer.problems import Problem, ProblemSampler, hard_problems
from trainer.rollout import RolloutSettings, ToolRunner
from trainer.sft import check_conversations, final_turns, fine_tune, whole_probability
from trainer.step import StepContext, rl_step, rollout_settings
from trainer.tool_runners import open_runner
from trainer.tracking import MetricsLog


def stage_rollout_settings(config: TrainConfig, stage: StageConfig) -> RolloutSettings:
    return rollout_settings(
        config,
        stage.max_turns or config.rollout.max_turns,
        stage.max_response_tokens or config.rollout.max_response_tokens,
    )


async def stage_problems(
    stage: StageConfig,
    problems: list[Problem],
    state: TrainState,
    policy: Policy,
    runner: ToolRunner,
    config: TrainConfig,
    backend: GenerationBackend | None = None,
    dp: DataParallel = SINGLE,
) -> list[Problem]:
    """The stage's problem set: all of them, or (``hard_only``) those the current policy does
    not solve in every one of ``hard_filter_samples`` rollouts. Chosen once per stage and kept
    in the training state, so a resumed run trains on the same set."""
    if not stage.hard_only:
        return problems
    if state.stage_problem_ids is None:
        candidates = problems[: stage.hard_filter_max_problems]
        settings = stage_rollout_settings(config, stage)
        counts, _ = await correct_counts(
            candidates, stage.hard_filter_samples, policy, runner, settings, config, backend, dp
        )
        state.stage_problem_ids = [
            p.id for p in hard_problems(candidates, counts, stage.hard_filter_samples)
        ]
    by_id = {p.id: p for p in problems}
    return [by_id[i] for i in state.stage_problem_ids]


def frozen_copy(policy: Policy) -> Policy:
    """A reference policy: the weights as they are now, never trained."""
    reference = copy.deepcopy(policy)
    reference.model.requires_grad_(False)
    return reference


def warm_start(policy: Policy, config: TrainConfig, output: Path, progress: bool) -> None:
    losses = fine_tune(policy, config, progress)
    check = check_conversations(config.sft, config.seed)
    policy.save(output / "sft")
    summary = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}
    if check:
        samples = final_turns(policy, check, config.prompt.style)
        summary["check_probability"] = whole_probability(
            policy, samples, config.optim.micro_batch_tokens
        )
    (output / "sft" / "sft_summary.json").write_text(json.dumps(summary))


def check_parallel(config: TrainConfig, dp: DataParallel) -> None:
    """Refuse what a sharded run cannot do (yet)."""
    if config.sft.enabled and config.model.fsdp:
        raise ValueError("sft.enabled with model.fsdp: run python -m trainer.sft first")
    if not dp.distributed:
        return
    if config.rollout.backend == "hf":
        raise ValueError("rollout.backend hf cannot generate from a model sharded over ranks")
    if config.loss.kl_coef > 0:
        raise ValueError("kl_coef > 0 (a reference policy) runs on one process only, for now")


class Trainer:
    """The state of one run between steps; ``run`` drives it."""

    def __init__(self, config: TrainConfig, output: Path, resume: bool, progress: bool) -> None:
        self.host = policy_host(config.model)
        self.dp = self.host.dp
        check_parallel(config, self.dp)
        self.writer = self.dp.rank == 0
        self.config, self.output, self.progress = config, output, progress and self.writer
        output.mkdir(parents=True, exist_ok=True)
        if self.writer:
            save_config(config, output / "config.yaml")
        torch.manual_seed(config.seed)
        self.rng = random.Random(config.seed)
        checkpoint = latest_checkpoint(output) if resume else None
        model_path = checkpoint / "model" if checkpoint else None
        self.policy = self.host.load(config.model, model_path, config.seed)
        self.optimizer, self.schedule = build_optimizer(self.policy.model, config.optim)
        self.state = TrainState()
        if checkpoint is not None:
            load_optimizer = self.host.optimizer_loader(self.policy, self.optimizer)
            self.state = load_training_state(
                checkpoint, self.optimizer, self.schedule, self.rng, load_optimizer
            )
        self.problems = problems_of(config.data.train)
        self.eval_problems = (
            problems_of(config.data.eval)[: config.eval.max_problems]
            if config.eval.every and config.data.eval
            else []
        )
        self.reference: Policy | None = None
        if checkpoint is not None and (checkpoint / "reference").is_dir():
            self.reference = load_policy(config.model, checkpoint / "reference")
            self.reference.model.requires_grad_(False)

    def save(self) -> Path | None:
        # gathered by every rank (when sharded), written by rank 0
        states = self.host.checkpoint_states(self.policy, self.optimizer)
        path = None
        if self.writer:
            path = save_checkpoint(
                self.output,
                self.policy,
                self.optimizer,
                self.schedule,
                self.state,
                self.rng,
                self.config.checkpoint.keep,
                **states,
                reference=self.reference if self.host.keeps_reference else None,
            )
        if self.dp.distributed:
            torch.distributed.barrier()
        return path

    def make_backend(self) -> GenerationBackend:
        """The configured generation backend; vLLM engines start from the current policy."""
        config = self.config
        if config.rollout.backend == "hf":
            return HFBackend(self.policy.model, self.policy.tokenizer, config.rollout.max_batch)
        from trainer.backends.vllm import VLLMBackend

        path = self.output / "rollout_model"
        self.host.save_pretrained(self.policy, path)
        engine = VLLMBackend(config.vllm, str(path), self.dp)
        return EngineGroup(engine, self.dp) if config.rollout.engines == "shared" else engine

    async def run(self, runner: ToolRunner, max_steps: int | None) -> list[dict[str, Any]]:
        config, state = self.config, self.state
        if config.sft.enabled and not state.sft_done:
            warm_start(self.policy, config, self.output, self.progress)
            state.sft_done = True
        if config.loss.kl_coef > 0 and self.reference is None:
            self.reference = frozen_copy(self.policy)
        backend = self.make_backend()
        history: list[dict[str, Any]] = []
        bar = tqdm(
            total=config.total_steps, initial=state.step, desc="grpo-roc", disable=not self.progress
        )
        # The engine's processes end with the run, not at interpreter exit (where vLLM's output
        # handler would see its engine die and log it as a failure).
        log = MetricsLog(self.output, config, enabled=self.writer)
        with contextlib.closing(backend), bar, log:
            if config.eval.every and state.step == 0:  # the starting point, before any update
                stage = config.stages[state.stage]
                log.write(
                    {"step": 0, "stage": stage.name, **await self.evaluate(stage, runner, backend)}
                )
            while state.stage < len(config.stages) and (
                max_steps is None or len(history) < max_steps
            ):
                stage = config.stages[state.stage]
                budget = None if max_steps is None else max_steps - len(history)
                history += await self._run_stage(stage, runner, backend, log, bar, budget)
                if state.stage_step >= stage.steps:
                    state.stage, state.stage_step = state.stage + 1, 0
                    state.sampler, state.stage_problem_ids = {}, None
                    if state.stage < len(config.stages):
                        self.enter_stage(config.stages[state.stage])
        if history and (config.checkpoint.every == 0 or state.step % config.checkpoint.every):
            self.save()
        return history

    async def evaluate(
        self, stage: StageConfig, runner: ToolRunner, backend: GenerationBackend
    ) -> dict[str, float]:
        """avg@k of the policy as it is now on the held-out problems (``eval``), with the
        stage's rollout settings. Its sampling draws from a fork of torch's generator, so a run
        trains alike with evaluation on or off (with the transformers backend)."""
        config, start = self.config, time.monotonic()
        settings = stage_rollout_settings(config, stage)
        if config.eval.temperature is not None:
            settings = replace(settings, temperature=config.eval.temperature)
        with torch.random.fork_rng(devices=[]):
            counts, groups = await correct_counts(
                self.eval_problems, config.eval.k, self.policy, runner, settings, config, backend
            )
        return {
            **eval_metrics(counts, config.eval.k, groups),
            "eval_time_s": time.monotonic() - start,
        }

    def enter_stage(self, stage: StageConfig) -> None:
        """The stage change, done once when the previous stage's last step is behind us (a run
        resumed from that step's checkpoint does it on resuming, never twice)."""
        if stage.reset_optimizer:
            reset_optimizer_state(self.optimizer)
        if stage.reset_reference and self.reference is not None:
            self.reference = frozen_copy(self.policy)

    async def _run_stage(
        self,
        stage: StageConfig,
        runner: ToolRunner,
        backend: GenerationBackend,
        log: MetricsLog,
        bar: tqdm,
        budget: int | None,
    ) -> list[dict[str, Any]]:
        config, state = self.config, self.state
        problems = await stage_problems(
            stage, self.problems, state, self.policy, runner, config, backend, self.dp
        )
        if not problems:
            tqdm.write(f"stage {stage.name}: no problem left that the policy does not always solve")
            state.stage_step = stage.steps
            return []
        sampler = ProblemSampler(
            problems, seed=config.seed + state.stage, shuffle=config.data.shuffle
        )
        if state.sampler:
            sampler.load_state_dict(state.sampler)
        ctx = StepContext(
            self.policy,
            self.optimizer,
            backend,
            runner,
            config,
            stage_rollout_settings(config, stage),
            self.rng,
            self.reference,
            self.dp,
        )
        history: list[dict[str, Any]] = []
        while state.stage_step < stage.steps and (budget is None or len(history) < budget):
            batch = sampler.take(config.rollout.prompts_per_step)
            metrics, groups = await rl_step(batch, ctx)
            lr = self.schedule.get_last_lr()[0]
            if metrics["updated"]:  # warm-up counts optimizer updates, not skipped steps
                self.schedule.step()
            state.step, state.stage_step, state.sampler = (
                state.step + 1,
                state.stage_step + 1,
                sampler.state_dict(),
            )
            line = {"step": state.step, "stage": stage.name, "lr": lr, **metrics}
            every = config.eval.every
            if every and (state.step % every == 0 or state.step == config.total_steps):
                line.update(await self.evaluate(stage, runner, backend))
            log.write(line)
            history.append(line)
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['reward_mean']:.3f}", calls=int(metrics["tool_calls"])
            )
            if (
                self.writer
                and config.logging.sample_every
                and not state.step % config.logging.sample_every
            ):
                tqdm.write(self.policy.tokenizer.decode(groups[0][0].rollout.response_ids))
            if config.checkpoint.every and state.step % config.checkpoint.every == 0:
                self.save()
        return history


async def train(
    config: TrainConfig,
    output: str | Path,
    sandbox_url: str | None = None,
    resume: bool = True,
    max_steps: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run (or continue) training; the metrics of the steps run by this call."""
    trainer = Trainer(config, Path(output), resume, progress)
    async with open_runner(sandbox_url or config.tool.sandbox_url) as runner:
        return await trainer.run(runner, max_steps)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key.sub=value`` pairs, values read as YAML (``1e-6``, ``true``, ``[0.9, 0.95]``)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    return overrides


def reward_trend(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean reward of the first and the last quarter of the steps (at least one step each)."""
    if not history:
        return {}
    n = max(1, len(history) // 4)
    rewards = [h["reward_mean"] for h in history]
    return {
        "steps": len(history),
        "reward_first": sum(rewards[:n]) / n,
        "reward_last": sum(rewards[-n:]) / n,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument(
        "--sandbox-url", help="a running service; 'subprocess': no sandbox (development)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value"
    )
    parser.add_argument("--max-steps", type=int, help="stop after this many RL steps (resumable)")
    parser.add_argument(
        "--no-resume", action="store_true", help="start over even if checkpoints exist"
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    config = load_config(args.config, parse_overrides(args.set))
    history = asyncio.run(
        train(
            config,
            args.output,
            args.sandbox_url,
            not args.no_resume,
            args.max_steps,
            not args.no_progress,
        )
    )
    print(json.dumps(reward_trend(history)))


if __name__ == "__main__":
    main()
