"""SFT warm start: fine-tune on conversations, the loss on the assistant's tokens only.

The recipe's first stage is non-reasoning SFT (the report: function-calling, instruction-
following and chat data, 3 epochs, lr 5e-6, batch 128): it teaches the tool-call format and
the answer tags before RL, without reasoning traces. The data is read in any format of
``sft_data`` (OpenAI messages with tool calls and results, ShareGPT with function_call /
observation, xLAM), rendered by ``chat.conversation_segments`` (the same pieces the rollout
loop produces, in ``prompt.style``), each segment tokenised on its own, as in a rollout.
System, user and tool-response tokens get mask 0.

    python -m trainer.sft --config trainer/configs/tiny_cpu.yaml --output runs/sft
    torchrun --nproc-per-node 8 -m trainer.sft --config trainer/configs/rstar2_agent_14b.yaml \\
        --output runs/sft --data sft.jsonl          # model.fsdp: sharded over the ranks

``sft.epochs`` passes over the data in shuffled batches of ``sft.batch_size`` conversations;
without it, ``sft.steps`` batches drawn at random. With ``sft.stop_probability`` (toy data) the
run stops early once the model writes held-out answers right with that probability: a tiny
model learns to copy the tool's output after a number of steps that varies with the seed.
A batch's loss is the mean over all its trained tokens, whatever their micro-batches and ranks.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from tqdm import tqdm

from trainer.chat import conversation_segments
from trainer.config import OptimConfig, SftConfig, TrainConfig, load_config
from trainer.grpo import sequence_scales
from trainer.modeling import Policy
from trainer.optim import build_optimizer
from trainer.parallel import SINGLE, DataParallel
from trainer.policy_host import policy_host
from trainer.sft_data import load_sft_rows
from trainer.tools import PromptStyle
from trainer.toy_task import toy_conversations
from trainer.update import Sample, forward, micro_batches

TOY = "toy"
TOY_SEED_OFFSET = 10_000  # toy SFT transcripts are on toy_problems(n, seed + this)
CHECK_SEED_OFFSET = 20_000  # and the held-out ones of sft.stop_probability on seed + this
Conversation = Sequence[Mapping[str, Any]]


def load_conversations(config: SftConfig, seed: int = 0) -> list[Conversation]:
    """Conversations from a file (``sft_data``), or ``toy``: generated toy-task transcripts (on
    problems other than the shipped training set's)."""
    if config.data == TOY:
        return list(
            toy_conversations(
                config.toy_transcripts, seed + TOY_SEED_OFFSET, config.toy_direct_share
            )
        )
    return list(load_sft_rows(config.data, config.format))


def final_turns(policy: Policy, check: Sequence[Conversation], style: PromptStyle) -> list[Sample]:
    """The held-out conversations encoded, only their final turns trained on (checked)."""
    return [final_turn(encode_conversation(policy, m, style)) for m in check]


def check_conversations(config: SftConfig, seed: int = 0) -> list[Conversation]:
    """What ``sft.stop_probability`` is checked on: toy solutions with the tool, on problems
    neither the SFT transcripts nor the shipped training set hold; their final turn copies
    the number the tool printed into the answer."""
    if config.stop_probability is None:
        return []
    if config.data != TOY:
        raise ValueError("sft.stop_probability is checked on toy transcripts only (sft.data: toy)")
    return list(toy_conversations(config.check_transcripts, seed + CHECK_SEED_OFFSET, 0.0))


def encode_conversation(
    policy: Policy, messages: Conversation, style: PromptStyle = "plain"
) -> Sample:
    ids: list[int] = []
    mask: list[int] = []
    for segment in conversation_segments(messages, style):
        piece = policy.tokenizer.encode(segment.text, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([int(segment.trainable)] * len(piece))
    return Sample(token_ids=ids, loss_mask=mask, advantage=0.0)


def batch_rows(n: int, config: SftConfig, rng: random.Random) -> list[list[int]]:
    """Each optimizer step's rows: ``epochs`` shuffled passes, or ``steps`` random draws."""
    if config.epochs is None:
        return [rng.sample(range(n), min(config.batch_size, n)) for _ in range(config.steps)]
    batches = []
    for _ in range(config.epochs):
        order = list(range(n))
        rng.shuffle(order)
        batches += [order[i : i + config.batch_size] for i in range(0, n, config.batch_size)]
    return batches


def final_turn(sample: Sample) -> Sample:
    """``sample`` trained on its last turn only (the answer, what came before it given)."""
    last_given = max((i for i, m in enumerate(sample.loss_mask) if not m), default=-1)
    mask = [int(i > last_given) for i in range(len(sample.loss_mask))]
    return Sample(sample.token_ids, mask, sample.advantage)


def whole_probability(
    policy: Policy, samples: Sequence[Sample], micro_batch_tokens: int = 16384
) -> float:
    """The mean probability that the policy, sampling at temperature 1, writes each sample's
    trained tokens exactly, the rest of the transcript given."""
    policy.model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in micro_batches(policy, samples, range(len(samples)), micro_batch_tokens):
            logprobs, _ = forward(policy, batch)  # (B, T)
            total += (logprobs * batch.mask).sum(-1).exp().sum().item()
    policy.model.train()
    return total / max(1, len(samples))


def run_sft(
    policy: Policy,
    conversations: Sequence[Conversation],
    config: SftConfig,
    seed: int = 0,
    micro_batch_tokens: int = 16384,
    progress: bool = True,
    style: PromptStyle = "plain",
    dp: DataParallel = SINGLE,
    check: Sequence[Conversation] = (),
) -> list[float]:
    """Fine-tune ``policy`` in place; the loss of every step (token-mean cross-entropy).
    ``style``: the prompt style the RL run will use (``prompt.style``); ``dp``: the ranks of a
    sharded policy, each passing the same conversations; ``check``: held-out conversations;
    the run stops once the policy writes their final turns right (``whole_probability``) with
    ``sft.stop_probability``."""
    samples = [encode_conversation(policy, m, style) for m in conversations]
    checked = final_turns(policy, check, style)
    if config.max_tokens is not None:
        samples = [s for s in samples if len(s.token_ids) <= config.max_tokens]
    if not samples:
        raise ValueError("sft: no conversation to train on")
    optim = OptimConfig(
        lr=config.lr, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay
    )
    optimizer, schedule = build_optimizer(policy.model, optim)
    rng = random.Random(seed)
    losses = []
    policy.model.train()
    bar = tqdm(batch_rows(len(samples), config, rng), desc="sft", disable=not progress)
    for step, rows in enumerate(bar, 1):
        kept = torch.tensor([sum(samples[i].loss_mask[1:]) for i in rows], dtype=torch.float32)
        scale_of = dict(zip(rows, sequence_scales(kept, "token_mean").tolist(), strict=True))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch in micro_batches(policy, samples, rows, micro_batch_tokens, dp):
            logprobs, _ = forward(policy, batch)  # (B, T)
            scale = torch.tensor(
                [scale_of[i] for i in batch.rows] or [0.0], device=policy.device
            )  # (B,); a rank's empty padding batch weighs 0
            loss = -(logprobs * batch.mask * scale.unsqueeze(-1)).sum()
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(dp.all_reduce_sum([total], policy.device)[0])
        if checked and config.stop_probability is not None and step % config.check_every == 0:
            solved = whole_probability(policy, checked, micro_batch_tokens)
            bar.set_postfix(solved=f"{solved:.2f}")
            if solved >= config.stop_probability:
                break
    return losses


def fine_tune(
    policy: Policy, config: TrainConfig, progress: bool = True, dp: DataParallel = SINGLE
) -> list[float]:
    """The ``sft`` section's fine-tuning of ``policy`` (in place); the loss of every step."""
    sft, seed = config.sft, config.seed
    check = check_conversations(sft, seed)
    common = (seed, config.optim.micro_batch_tokens, progress, config.prompt.style, dp)
    if sft.data == TOY and sft.toy_copy_first:
        copying = load_conversations(replace(sft, toy_direct_share=0.0), seed)
        losses = run_sft(policy, copying, sft, *common, check=check)
        mixing = replace(sft, steps=sft.mix_steps, epochs=None, stop_probability=None)
        return losses + run_sft(policy, load_conversations(sft, seed), mixing, *common)
    return run_sft(policy, load_conversations(sft, seed), sft, *common, check=check)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", required=True, help="training config (its model and sft sections)"
    )
    parser.add_argument("--output", required=True, help="directory for the fine-tuned model")
    parser.add_argument("--data", help="conversations, any sft_data format (overrides sft.data)")
    parser.add_argument("--steps", type=int, help="overrides sft.steps")
    parser.add_argument("--epochs", type=int, help="overrides sft.epochs")
    args = parser.parse_args(argv)
    given = {"sft.data": args.data, "sft.steps": args.steps, "sft.epochs": args.epochs}
    overrides = {k: v for k, v in given.items() if v is not None}
    config = load_config(args.config, overrides)
    torch.manual_seed(config.seed)
    host = policy_host(config.model)
    policy, dp = host.load(config.model, None, config.seed), host.dp
    losses = fine_tune(policy, config, progress=dp.rank == 0, dp=dp)
    host.save_pretrained(policy, args.output)
    if dp.rank == 0:
        print(json.dumps({"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}))


if __name__ == "__main__":
    main()
