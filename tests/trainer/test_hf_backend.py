"""backends/hf.py: per-row stops, budgets and logprobs of transformers generation."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from trainer.backends.base import GenerationRequest, SamplingParams
from trainer.backends.hf import HFBackend
from trainer.config import TinyModelConfig
from trainer.grpo import token_logprobs
from trainer.tiny_model import build_model

STOP = "</tool_call>"


def flat_model(tokenizer: PreTrainedTokenizerFast, favoured: list[str]) -> PreTrainedModel:
    """A tiny model whose next-token distribution is the same everywhere: uniform over the
    vocabulary but for ``favoured`` tokens, each about a quarter as likely as all others."""
    torch.manual_seed(0)
    model = build_model(tokenizer, TinyModelConfig(num_layers=1))
    with torch.no_grad():
        model.model.norm.weight.zero_()  # hidden state 0 -> logits 0, then the bias below
    vocab = len(tokenizer)
    bias = torch.zeros(vocab)
    for token in favoured:
        bias[tokenizer.convert_tokens_to_ids(token)] = torch.log(torch.tensor(vocab / 4))
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    return model


def test_rows_stop_at_stop_string_eos_or_their_own_budget(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    model = flat_model(tokenizer, [STOP, tokenizer.eos_token])
    backend = HFBackend(model, tokenizer, max_batch=16)
    prompts = [tokenizer.encode("x" * (1 + i % 5)) for i in range(48)]
    requests = [GenerationRequest(p, max_new_tokens=2 + i % 7) for i, p in enumerate(prompts)]
    torch.manual_seed(1)
    generations = asyncio.run(backend.generate(requests, SamplingParams(stop=(STOP,))))
    stop_id, eos_id = tokenizer.convert_tokens_to_ids(STOP), tokenizer.eos_token_id
    reasons = set()
    for request, generation in zip(requests, generations, strict=True):
        ids = generation.token_ids
        reasons.add(generation.finish_reason)
        assert 1 <= len(ids) <= request.max_new_tokens
        assert len(generation.logprobs) == len(ids)
        assert stop_id not in ids[:-1] and eos_id not in ids[:-1]  # nothing runs past an end
        if generation.finish_reason == "stop":  # the stop string ends in the last token
            assert STOP in tokenizer.decode(ids, skip_special_tokens=False)
            assert STOP not in tokenizer.decode(ids[:-1], skip_special_tokens=False)
        elif generation.finish_reason == "eos":
            assert ids[-1] == eos_id
        else:
            assert len(ids) == request.max_new_tokens and ids[-1] not in (stop_id, eos_id)
    assert reasons == {"stop", "eos", "length"}


def test_logprobs_are_those_of_the_sampled_distribution(tokenizer: PreTrainedTokenizerFast) -> None:
    torch.manual_seed(2)
    model = build_model(tokenizer, TinyModelConfig(num_layers=1))
    prompt = tokenizer.encode("What is 1 + 2?")
    backend = HFBackend(model, tokenizer)
    params = SamplingParams(temperature=1.0)
    [generation] = asyncio.run(backend.generate([GenerationRequest(prompt, 12)], params))
    ids = torch.tensor([prompt + generation.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    recomputed = token_logprobs(logits, ids[:, 1:])[0, len(prompt) - 1 :]
    assert generation.logprobs == pytest.approx(recomputed.tolist(), abs=1e-4)
    assert model.training  # generation left the module as it found it


def test_greedy_generation_is_deterministic(tokenizer: PreTrainedTokenizerFast) -> None:
    torch.manual_seed(3)
    model = build_model(tokenizer, TinyModelConfig(num_layers=1))
    backend = HFBackend(model, tokenizer)
    request = [GenerationRequest(tokenizer.encode("abc"), 10)] * 2
    runs = [asyncio.run(backend.generate(request, SamplingParams(temperature=0))) for _ in range(2)]
    assert runs[0][0].token_ids == runs[0][1].token_ids == runs[1][0].token_ids
