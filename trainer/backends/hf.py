"""Generation with transformers' ``generate``: the backend for CPU runs, tests and one GPU.

It shares the policy module with the trainer (no weight copy: ``update_weights`` is a no-op).
Prompts of different lengths are left-padded into one batch. Each row stops at its own stop
string, end-of-sequence token or token budget; a stopping criterion records which came first,
so finish reasons and lengths are exact even if the model samples the pad token.

Departures from ``generate``'s defaults, on purpose: ``top_k`` is 0 (transformers would
otherwise apply top-50, and RL samples the policy's full distribution at temperature 1.0).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import StoppingCriteria, StoppingCriteriaList

from trainer.backends.base import (
    FinishReason,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from trainer.chat import decode

REASONS: tuple[FinishReason, ...] = ("eos", "stop", "length")


class _StopStrings:
    """Which rows' generated text now contains a stop string.

    Only rows whose newest token could end one (its text holds a stop string's last character)
    are decoded, and only their last few tokens: enough for any stop string, since every token
    is at least one byte. Works with any vocabulary (transformers' ``StopStringCriteria`` needs
    each stop string to be spellable from token strings).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.window = max(len(s.encode()) for s in stops) + 1
        last_chars = {s[-1] for s in stops}
        decoded = [decode(tokenizer, [i]) for i in range(len(tokenizer))]
        ids = [i for i, text in enumerate(decoded) if any(c in text for c in last_chars)]
        self.candidates = torch.tensor(ids, dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
        hit = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        maybe = torch.isin(input_ids[:, -1].cpu(), self.candidates)
        start = max(prompt_len, input_ids.shape[1] - self.window)
        for row in maybe.nonzero().flatten().tolist():
            tail = decode(self.tokenizer, input_ids[row, start:].tolist())
            hit[row] = any(stop in tail for stop in self.stops)
        return hit


class _RowStops(StoppingCriteria):
    """Marks each row done at its first end-of-sequence, stop string or budget; records which."""

    def __init__(
        self,
        prompt_len: int,
        budgets: torch.Tensor,
        eos_ids: torch.Tensor,
        stop: _StopStrings | None,
    ) -> None:
        self.prompt_len, self.budgets, self.eos_ids, self.stop = prompt_len, budgets, eos_ids, stop
        self.length = torch.full_like(budgets, -1)  # generated tokens at the end; -1: running
        self.reason = torch.full_like(budgets, -1)  # index into REASONS

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_len
        hits = [
            torch.isin(input_ids[:, -1], self.eos_ids),
            self.stop(input_ids, self.prompt_len).to(self.budgets.device)
            if self.stop is not None
            else torch.zeros_like(self.budgets, dtype=torch.bool),
            self.budgets <= generated,
        ]
        for code, hit in enumerate(hits):
            new = hit.to(self.length.device) & (self.length < 0)
            self.length[new] = generated
            self.reason[new] = code
        return self.length >= 0


class HFBackend(GenerationBackend):
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch: int = 64,
    ) -> None:
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        eos = {tokenizer.eos_token_id} | set(_as_list(model.generation_config.eos_token_id))
        self.eos_ids = sorted(i for i in eos if i is not None)
        self._stop_criteria: dict[tuple[str, ...], _StopStrings] = {}

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        # In a worker thread, so the event loop (tool calls of other rollouts) runs meanwhile.
        # One call at a time per model: generation switches the module to eval mode.
        return await asyncio.to_thread(self._generate_all, requests, params)

    def _generate_all(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.max_batch):
            out.extend(self._generate_batch(requests[start : start + self.max_batch], params))
        return out

    def _stop_criterion(self, stop: tuple[str, ...]) -> _StopStrings | None:
        if not stop:
            return None
        if stop not in self._stop_criteria:  # building one decodes the whole vocabulary
            self._stop_criteria[stop] = _StopStrings(self.tokenizer, stop)
        return self._stop_criteria[stop]

    @torch.no_grad()
    def _generate_batch(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        device = self.model.device
        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), pad, dtype=torch.long)  # (B, L)
        attention = torch.zeros((len(requests), width), dtype=torch.long)  # (B, L)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            input_ids[row, width - n :] = torch.tensor(list(request.prompt_ids))
            attention[row, width - n :] = 1
        budgets = torch.tensor([max(r.max_new_tokens, 1) for r in requests], device=device)
        stops = _RowStops(
            width,
            budgets,
            torch.tensor(self.eos_ids, device=device),
            self._stop_criterion(params.stop),
        )
        greedy = params.temperature <= 0
        with _eval_mode(self.model):
            output = self.model.generate(  # type: ignore[operator]
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                do_sample=not greedy,
                temperature=None if greedy else params.temperature,
                top_k=0,
                top_p=None if greedy else params.top_p,
                max_new_tokens=int(budgets.max()),
                stopping_criteria=StoppingCriteriaList([stops]),
                eos_token_id=self.eos_ids,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=True,
            )
        new_tokens = output.sequences[:, width:]  # (B, S)
        logprobs = _sampled_logprobs(output.logits, new_tokens, params.temperature)  # (B, S)
        results = []
        for row in range(len(requests)):
            n = int(stops.length[row]) if stops.length[row] >= 0 else new_tokens.shape[1]
            reason = REASONS[int(stops.reason[row])] if stops.reason[row] >= 0 else "length"
            results.append(
                Generation(new_tokens[row, :n].tolist(), logprobs[row, :n].tolist(), reason)
            )
        return results


def _sampled_logprobs(
    logits: Sequence[torch.Tensor], tokens: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per-step logits S x (B, V) and tokens (B, S) -> log-probabilities (B, S) of the
    distribution sampled from (temperature applied; top-k and top-p are off)."""
    scale = temperature if temperature > 0 else 1.0
    steps = [
        torch.log_softmax(step.float() / scale, dim=-1).gather(-1, tokens[:, i : i + 1]).squeeze(-1)
        for i, step in enumerate(logits)
    ]
    return torch.stack(steps, dim=1).cpu()  # (B, S)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
