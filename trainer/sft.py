"""SFT warm start: fine-tune on tool-use transcripts, the loss on the assistant's tokens only.

The recipe's first stage (non-reasoning SFT) teaches the tool-call format and the answer tags
before RL. Transcripts are JSONL rows ``{"messages": [...]}`` (system?, user, then assistant
turns each followed by its tool responses); they are rendered by ``chat.conversation_segments``,
the same pieces the rollout loop produces, and each segment is tokenised on its own, as in a
rollout. Prompt, user and tool-response tokens get mask 0.

    python -m trainer.sft --config trainer/configs/tiny_cpu.yaml --output runs/sft
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from trainer.chat import conversation_segments
from trainer.config import OptimConfig, SftConfig, load_config
from trainer.grpo import sequence_scales
from trainer.modeling import Policy, load_policy
from trainer.optim import build_optimizer
from trainer.tools import PromptStyle
from trainer.toy import toy_conversations
from trainer.update import Sample, forward, micro_batches

TOY = "toy"
TOY_SEED_OFFSET = 10_000  # toy SFT transcripts are on toy_problems(n, seed + this)


def load_conversations(config: SftConfig, seed: int = 0) -> list[list[dict[str, str]]]:
    """Transcripts from a JSONL file, or ``toy``: generated toy-task transcripts (on problems
    other than the shipped training set's)."""
    if config.data == TOY:
        return toy_conversations(
            config.toy_transcripts, seed + TOY_SEED_OFFSET, config.toy_direct_share
        )
    source = config.data
    with Path(source).open() as f:
        return [json.loads(line)["messages"] for line in f if line.strip()]


def encode_conversation(
    policy: Policy, messages: Sequence[dict[str, str]], style: PromptStyle = "plain"
) -> Sample:
    ids: list[int] = []
    mask: list[int] = []
    for segment in conversation_segments(messages, style):
        piece = policy.tokenizer.encode(segment.text, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([int(segment.trainable)] * len(piece))
    return Sample(token_ids=ids, loss_mask=mask, advantage=0.0)


def run_sft(
    policy: Policy,
    conversations: Sequence[Sequence[dict[str, str]]],
    config: SftConfig,
    seed: int = 0,
    micro_batch_tokens: int = 16384,
    progress: bool = True,
    style: PromptStyle = "plain",
) -> list[float]:
    """Fine-tune ``policy`` in place; the loss of every step (token-mean cross-entropy).
    ``style``: the prompt style the RL run will use (``prompt.style``)."""
    samples = [encode_conversation(policy, m, style) for m in conversations]
    optim = OptimConfig(
        lr=config.lr, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay
    )
    optimizer, schedule = build_optimizer(policy.model, optim)
    rng = random.Random(seed)
    losses = []
    policy.model.train()
    for _ in tqdm(range(config.steps), desc="sft", disable=not progress):
        rows = rng.sample(range(len(samples)), min(config.batch_size, len(samples)))
        kept = torch.tensor([sum(samples[i].loss_mask[1:]) for i in rows], dtype=torch.float32)
        scale_of = dict(zip(rows, sequence_scales(kept, "token_mean").tolist(), strict=True))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch in micro_batches(policy, samples, rows, micro_batch_tokens):
            logprobs, _ = forward(policy, batch)  # (B, T)
            scale = torch.tensor([scale_of[i] for i in batch.rows], device=policy.device)
            loss = -(logprobs * batch.mask * scale.unsqueeze(-1)).sum()
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(total)
    return losses


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", required=True, help="training config (its model and sft sections)"
    )
    parser.add_argument("--output", required=True, help="directory for the fine-tuned model")
    parser.add_argument("--data", help="JSONL transcripts (overrides sft.data)")
    parser.add_argument("--steps", type=int, help="overrides sft.steps")
    args = parser.parse_args(argv)
    overrides = {
        k: v for k, v in {"sft.data": args.data, "sft.steps": args.steps}.items() if v is not None
    }
    config = load_config(args.config, overrides)
    torch.manual_seed(config.seed)
    policy = load_policy(config.model, seed=config.seed)
    conversations = load_conversations(config.sft, config.seed)
    losses = run_sft(
        policy,
        conversations,
        config.sft,
        config.seed,
        config.optim.micro_batch_tokens,
        style=config.prompt.style,
    )
    policy.save(args.output)
    print(json.dumps({"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}))


if __name__ == "__main__":
    main()
