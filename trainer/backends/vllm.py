"""Generation with vLLM: async engines, token ids in and out, the policy pushed after each step.

Needs GPUs and the ``gpu`` extra (``pip install -e '.[trainer,gpu]'``, vLLM >=0.33,<0.35, with
the torch build vLLM pins; docs/gpu.md). This module imports without vLLM; building a backend
without it raises ``VllmMissing`` saying what to install.

How it works. The engine is vLLM's ``AsyncLLM`` (``vllm.AsyncLLMEngine`` is an alias of it),
owned by an event loop on a thread of its own: the rollout loop awaits generations from its
loop, while the synchronous weight push, and vLLM's own trainer-side transfer code, which calls
its client from worker threads, block on futures of the engine's loop. Every turn of every
rollout is one request, so all of a step's unfinished rollouts are in flight at once and the
engine batches them continuously; a rollout waiting on its tool calls holds no engine slot, and
prefix caching makes re-sending its transcript cheap.

Layouts (``vllm.layout``):

- ``colocated``: every trainer rank hosts one engine on its own GPU (tensor-parallel size 1).
  After the rollouts the engine sleeps (``sleep_level`` 1 or 2) so the update has the GPU;
  weights reach it through CUDA IPC, in buckets.
- ``separate``: trainer rank 0 hosts one engine of ``data_parallel_size`` replicas of
  ``tensor_parallel_size`` GPUs each, on ``devices`` (not the trainer's GPUs); vLLM balances
  requests across its replicas; weights go by NCCL broadcast from rank 0, the other trainer
  ranks only joining the FSDP gathers.

Version-specific choices, vLLM 0.33 (read in its source and 0.34's, which agree on all of it;
the range is pinned in pyproject). Checked without a GPU against vLLM 0.33.0's own classes
(``test_vllm_accepts_what_the_backend_builds``): the engine arguments, sampling parameters,
weight-transfer payloads and the weight source. The generation path runs on vLLM's CPU
engine (0.32.0, ``make test-vllm-cpu``). Not yet run on a GPU:

- ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))``; ``generate(TokensPrompt(
  prompt_token_ids=...), SamplingParams, request_id)`` is an async generator, read to its last
  output (``output_kind=RequestOutputKind.FINAL_ONLY``: no streamed partials).
- ``SamplingParams``: ``stop=["</tool_call>"]`` with ``include_stop_str_in_output=True``;
  ``logprobs=0`` (only the sampled token's); ``top_k=0`` (off; 0 and -1 both mean all tokens);
  ``skip_special_tokens=False`` and ``spaces_between_special_tokens=False`` (stop strings are
  matched on text with the markers in); ``detokenize`` stays on (stop strings need text).
- ``logprobs_mode="processed_logprobs"``: logprobs of the distribution sampled from
  (temperature and top-p applied); the default ``raw_logprobs`` is the model's before them.
- Finish: ``finish_reason == "length"`` is ``length``; ``"stop"`` with a str ``stop_reason`` is
  our ``stop``; ``"stop"`` with ``stop_reason`` None (EOS) or an int (a stop token) is ``eos``,
  the EOS id kept as the last token (the detokenizer appends it). Anything else ("abort",
  "error") raises.
- Weights: the native weight-transfer API (``weight_transfer_config=WeightTransferConfig(
  backend="ipc" | "nccl")``, ``AsyncLLM.init_weight_transfer_engine / start_weight_update /
  update_weights / finish_weight_update``, requests ``WeightTransferInitRequest`` and
  ``WeightTransferUpdateRequest``). IPC is driven here, one bucket per ``update_weights``
  (``names``, ``dtype_names``, ``shapes``, ``ipc_handles_pickled``: base64 of the pickled
  ``[{gpu_uuid: torch.multiprocessing.reductions.reduce_tensor(t)[1]}]``, the form vLLM's own
  HTTP client sends; the worker unpickles it only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``,
  which is set for the engine's processes, ours). The worker loads each bucket before the call
  returns, so a bucket is freed before the next is gathered. NCCL is vLLM's
  ``NCCLTrainerWeightTransferEngine`` (packed broadcast, bounded buffers) fed by a
  ``WeightSource`` over our gather, through a client that bridges to the engine's loop.
- ``reset_prefix_cache()`` after every push: cached blocks were computed by the old weights.
- Sleep (``enable_sleep_mode=True``): ``sleep(level)``; waking for a push is
  ``wake_up(tags=["weights"])``, the push, then ``wake_up(tags=["kv_cache"])``, so the KV cache
  is not allocated while the weights arrive. **Level 2 discards the weights** (vLLM keeps only
  the buffers): an engine woken without a push generates garbage, silently (vLLM issues 16564
  and 29341; 0.33 only logs a warning). So after a level-2 sleep this backend always pushes,
  even after a step that did not change the policy, and ``generate`` refuses to run on
  discarded weights it cannot restore.
- Engine placement: the engine's processes are spawned with ``CUDA_VISIBLE_DEVICES`` set to
  this rank's GPU (colocated) or ``devices`` (separate), and without torchrun's ``RANK`` /
  ``WORLD_SIZE`` / ``MASTER_*`` variables, which belong to the trainer's process group.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import logging
import os
import pickle
import threading
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import torch

from trainer.backends.base import (
    FinishReason,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from trainer.config import VllmConfig
from trainer.parallel import SINGLE, DataParallel
from trainer.placement import KvCapacity
from trainer.weights import Named, buckets, full_parameters, parameter_specs

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16  # vLLM's default, used only until the engine says its own
UNKNOWN_MAX_SEQS = 256  # vLLM's default max_num_seqs on GPUs

INSTALL = (
    "the vLLM backend needs vLLM and a CUDA build of torch: "
    "pip install -e '.[trainer,gpu]' on a GPU machine (docs/gpu.md); "
    "or set rollout.backend: hf"
)
INLINE_TRANSFER = "trainer-inline"  # the backend of vllm_inline, for an engine on the CPU
# Variables of the trainer's torchrun group that the engine's own processes must not inherit.
LAUNCHER_VARIABLES = (
    *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    *("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"),
)


class VllmMissing(ImportError):
    """vLLM is not installed here."""


@dataclass(frozen=True)
class VllmApi:
    """The vLLM names this module uses, imported once (tests substitute a double)."""

    AsyncEngineArgs: Any
    AsyncLLM: Any
    SamplingParams: Any
    TokensPrompt: Any
    RequestOutputKind: Any
    WeightTransferConfig: Any
    WeightTransferInitRequest: Any
    WeightTransferUpdateRequest: Any

    @classmethod
    def load(cls) -> VllmApi:
        try:
            from vllm import AsyncEngineArgs, SamplingParams, TokensPrompt
            from vllm.config import WeightTransferConfig
            from vllm.distributed.weight_transfer.base import (
                WeightTransferInitRequest,
                WeightTransferUpdateRequest,
            )
            from vllm.sampling_params import RequestOutputKind
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise VllmMissing(INSTALL) from exc
        return cls(
            AsyncEngineArgs,
            AsyncLLM,
            SamplingParams,
            TokensPrompt,
            RequestOutputKind,
            WeightTransferConfig,
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )


class EngineLoop:
    """An asyncio loop on a daemon thread: the engine lives and is awaited there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the engine's loop and wait, from any other thread."""
        return self.submit(coro).result()

    async def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the engine's loop and await, from another loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class SyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol (four blocking calls) over one engine."""

    def __init__(self, api: VllmApi, loop: EngineLoop, engine: Any) -> None:
        self.api, self.loop, self.engine = api, loop, engine

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        request = self.api.WeightTransferInitRequest(init_info=init_info)
        self.loop.call(self.engine.init_weight_transfer_engine(request))

    def start_weight_update(self) -> None:
        self.loop.call(self.engine.start_weight_update())

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        request = self.api.WeightTransferUpdateRequest(update_info=update_info)
        self.loop.call(self.engine.update_weights(request))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.loop.call(self.engine.finish_weight_update(weight_version))


def engine_environment(devices: str | None) -> contextlib.AbstractContextManager[None]:
    """Environment for spawning the engine's processes: their GPUs and no launcher variables.

    Also sets ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in this process for good, not only while
    spawning: the weight push's pickled IPC handles need it in the engine's workers, and with
    it set there the engine core pickles its replies of custom types, which this process (the
    front end) then refuses to decode without it ("VLLM_ALLOW_INSECURE_SERIALIZATION must be
    set to use custom utility result types", seen with vLLM 0.32 on CPU). Trainer and engine
    are one trust domain: processes of this job talking over local sockets."""
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    changes: dict[str, str | None] = dict.fromkeys(LAUNCHER_VARIABLES)
    if devices is not None:
        changes["CUDA_VISIBLE_DEVICES"] = devices
    return _environ(changes)


@contextlib.contextmanager
def _environ(changes: dict[str, str | None]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in changes}
    try:
        for key, value in changes.items():
            _set_env(key, value)
        yield
    finally:
        for key, value in saved.items():
            _set_env(key, value)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def physical_gpu(local_index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of this process's GPU ``local_index``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[local_index] if visible else str(local_index)


def weight_transfer(config: VllmConfig) -> str:
    """vLLM's weight-transfer backend for this layout and where the engine runs."""
    if config.layout == "separate":
        return "nccl"
    if torch.cuda.is_available():
        return "ipc"
    return INLINE_TRANSFER


def check_layout(config: VllmConfig) -> None:
    """Settings that the layout cannot honour are errors, not silently ignored."""
    if config.layout == "colocated":
        if config.tensor_parallel_size != 1 or config.data_parallel_size != 1:
            raise ValueError("vllm: a colocated engine is one GPU (tensor and data parallel 1)")
        if config.devices is not None:
            raise ValueError("vllm.devices: a colocated engine uses its trainer rank's GPU")
    else:
        if config.devices is None:
            raise ValueError("vllm.devices: the separate engine's GPUs, e.g. '4,5,6,7'")
        if config.sleep_level:
            raise ValueError("vllm.sleep_level: only a colocated engine sleeps")


def finish_reason(output: Any) -> FinishReason:
    """vLLM's (finish_reason, stop_reason) as ours (module docstring)."""
    if output.finish_reason == "length":
        return "length"
    if output.finish_reason == "stop":
        return "stop" if isinstance(output.stop_reason, str) else "eos"
    raise RuntimeError(f"vLLM request ended with {output.finish_reason!r}")


def to_generation(output: Any) -> Generation:
    """One ``CompletionOutput`` (``logprobs=0``) as a Generation. A stop string ends its
    token ids: vLLM drops any token sampled after the one that completes it."""
    ids = list(output.token_ids)
    if output.logprobs is None or len(output.logprobs) < len(ids):
        raise RuntimeError("vLLM returned fewer logprobs than tokens; was logprobs=0 set?")
    logprobs = [float(output.logprobs[i][token].logprob) for i, token in enumerate(ids)]
    return Generation(ids, logprobs, finish_reason(output))


class VLLMBackend(GenerationBackend):
    """Rollouts on vLLM; ``update_weights`` pushes the policy (module docstring)."""

    def __init__(
        self,
        config: VllmConfig,
        model_path: str,
        dp: DataParallel = SINGLE,
        api: VllmApi | None = None,
    ) -> None:
        check_layout(config)
        self.config, self.model_path, self.dp = config, model_path, dp
        self.api = api or VllmApi.load()
        self.colocated = config.layout == "colocated"
        self.per_rank = self.colocated
        # vLLM batches whatever requests are running: the rollout scheduler may send each turn
        # as it comes, placed by kv_capacity().
        self.continuous_batching = True
        self._held_blocks = 0  # KV blocks this backend's requests in flight may take, at most
        self._warned_capacity = False
        self.hosts_engine = self.colocated or dp.rank == 0
        self.dtype = getattr(torch, config.dtype)
        self.bucket_bytes = config.bucket_mb << 20
        self.loop: EngineLoop | None = None
        self.engine: Any = None
        self.awake = True
        self.weights_valid = True  # False after a level-2 sleep until the next push
        self.model: torch.nn.Module | None = None  # the policy, to restore discarded weights
        # How weights reach the engine: CUDA IPC beside a GPU, the tensors themselves beside an
        # engine on the CPU (vllm_inline), NCCL to a separate engine.
        self.transfer = weight_transfer(config)
        self._channel: Any = None  # True after the handshake, or the NCCL sender
        if self.hosts_engine:
            self.loop = EngineLoop()
            with engine_environment(self._engine_devices()):
                self.engine = self.loop.call(self._start_engine())

    # -- engine ---------------------------------------------------------------------------
    def _engine_devices(self) -> str | None:
        if not self.colocated:
            return self.config.devices
        if torch.cuda.is_available():
            return physical_gpu(torch.cuda.current_device())
        return None

    def engine_args(self) -> Any:
        c = self.config
        return self.api.AsyncEngineArgs(
            model=self.model_path,
            tensor_parallel_size=1 if self.colocated else c.tensor_parallel_size,
            data_parallel_size=1 if self.colocated else c.data_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            max_model_len=c.max_model_len,
            enable_prefix_caching=c.enable_prefix_caching,
            seed=c.seed + self.dp.rank,
            dtype=c.dtype,
            enforce_eager=c.enforce_eager,
            max_num_seqs=c.max_num_seqs,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.colocated and c.sleep_level > 0,
            weight_transfer_config=self.api.WeightTransferConfig(backend=self.transfer),
            disable_log_stats=True,
        )

    async def _start_engine(self) -> Any:
        return self.api.AsyncLLM.from_engine_args(self.engine_args())

    def close(self) -> None:
        if self.engine is not None and self.loop is not None:
            # On the engine's loop: its output handler cannot run between the engine core's
            # end and its own cancellation, and log the core's death as a failure.
            self.loop.call(self._shutdown())
            self.loop.stop()
            self.engine = None

    async def _shutdown(self) -> None:
        self.engine.shutdown()

    # -- generation -----------------------------------------------------------------------
    def sampling_params(self, params: SamplingParams, max_tokens: int) -> Any:
        return self.api.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p if params.temperature > 0 else 1.0,
            top_k=0,
            max_tokens=max_tokens,
            stop=list(params.stop),
            include_stop_str_in_output=True,
            logprobs=0,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            output_kind=self.api.RequestOutputKind.FINAL_ONLY,
        )

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        if not self.hosts_engine:
            raise RuntimeError("separate layout: only trainer rank 0 hosts the engine")
        assert self.loop is not None
        if not self.awake:
            self._wake()
        return list(await asyncio.gather(*(self.loop.wait(self._one(r, params)) for r in requests)))

    async def _one(self, request: GenerationRequest, params: SamplingParams) -> Generation:
        room = self.config.max_model_len - len(request.prompt_ids)
        max_tokens = min(request.max_new_tokens, room)
        if max_tokens < 1:  # the transcript fills the context: nothing more can be generated
            return Generation([], [], "length")
        prompt = self.api.TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        blocks = -(-(len(request.prompt_ids) + max_tokens) // self._block_size())
        self._held_blocks += blocks
        try:
            final = await self._final(prompt, self.sampling_params(params, max_tokens))
        finally:
            self._held_blocks -= blocks
        return to_generation(final.outputs[0])

    async def _final(self, prompt: Any, params: Any) -> Any:
        """One request, on the engine's loop: its last ``RequestOutput``."""
        final = None
        async for output in self.engine.generate(prompt, params, uuid.uuid4().hex):
            final = output
        if final is None:
            raise RuntimeError("vLLM returned no output")
        return final

    async def prompt_logprobs(self, ids: Sequence[int], start: int = 1) -> list[float]:
        """The engine's log p(ids[t] | ids[:t]) for t >= ``start`` (prompt logprobs, at
        temperature 1): what its weights make of a fixed sequence, to compare with the
        trainer's after a push."""
        assert self.loop is not None
        params = self.api.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        prompt = self.api.TokensPrompt(prompt_token_ids=list(ids))
        final = await self.loop.wait(self._final(prompt, params))
        if final.prompt_logprobs is None:
            raise RuntimeError("vLLM returned no prompt logprobs")
        return [final.prompt_logprobs[t][ids[t]].logprob for t in range(start, len(ids))]

    # -- KV capacity, for the rollout scheduler -------------------------------------------
    def _cache_config(self) -> Any:
        config = getattr(self.engine, "vllm_config", None)
        return getattr(config, "cache_config", None)

    def _block_size(self) -> int:
        return int(getattr(self._cache_config(), "block_size", None) or DEFAULT_BLOCK_SIZE)

    def kv_capacity(self) -> KvCapacity:
        """The engine's KV cache, for balanced placement (``trainer.placement``).

        vLLM's front end learns ``num_gpu_blocks`` (summed over data-parallel replicas) and
        ``block_size`` from its engine cores when they start, in ``vllm_config.cache_config``;
        the block pool itself lives in the engine-core process, out of reach without a round
        trip, so what this backend's own requests in flight may take (prompt plus
        ``max_tokens``) is counted here instead. Blocks that only cache prefixes count as
        free, as vLLM counts them. An engine that does not say how many blocks it has is
        taken to hold ``max_num_seqs`` full-length sequences: placement is then bounded by
        the sequence limit alone, which is what vLLM enforces itself."""
        if not self.hosts_engine or self.engine is None:
            raise RuntimeError("only the rank that hosts the engine places rollouts on it")
        c = self.config
        replicas = 1 if self.colocated else c.data_parallel_size
        scheduler = getattr(getattr(self.engine, "vllm_config", None), "scheduler_config", None)
        per_replica = getattr(scheduler, "max_num_seqs", None) or c.max_num_seqs
        max_seqs = per_replica * replicas if per_replica else None
        block_size = self._block_size()
        total = getattr(self._cache_config(), "num_gpu_blocks", None)
        if not total:
            if not self._warned_capacity:
                log.warning("vLLM did not report num_gpu_blocks: placing by max_num_seqs only")
                self._warned_capacity = True
            seqs = max_seqs or UNKNOWN_MAX_SEQS
            total = seqs * -(-c.max_model_len // block_size)
        total = int(total)
        return KvCapacity(block_size, total, max(0, total - self._held_blocks), max_seqs)

    # -- phases and weights ---------------------------------------------------------------
    def offload(self) -> None:
        """Sleep (colocated, ``sleep_level`` > 0) so that the update has the GPU."""
        if not (self.colocated and self.config.sleep_level > 0 and self.awake):
            return
        assert self.loop is not None
        self.loop.call(self.engine.sleep(level=self.config.sleep_level))
        self.awake = False
        if self.config.sleep_level >= 2:
            self.weights_valid = False

    def update_weights(self, model: torch.nn.Module, changed: bool = True) -> None:
        """Every rank, after every step: push if the policy ``changed`` or the engine lost
        its weights (level-2 sleep), then wake. A collective under FSDP."""
        self.model = model
        if changed or not self.weights_valid:
            self._push(model)
        elif self.hosts_engine and not self.awake:
            self._wake_all()

    def _wake(self) -> None:
        """Wake before generating; discarded weights are pushed back first."""
        if not self.weights_valid:
            if self.model is None:
                raise RuntimeError(
                    "level-2 sleep discarded the engine's weights and no policy was pushed "
                    "since: call update_weights(model) before generating"
                )
            self._push(self.model)
        else:
            self._wake_all()

    def _wake_all(self) -> None:
        assert self.loop is not None
        self.loop.call(self.engine.wake_up())
        self.loop.call(self.engine.reset_prefix_cache())
        self.awake = True

    def _push(self, model: torch.nn.Module) -> None:
        asleep = self.hosts_engine and not self.awake
        if asleep:
            assert self.loop is not None
            self.loop.call(self.engine.wake_up(tags=["weights"]))
        if self.colocated:
            self._push_local(model)
        else:
            self._push_nccl(model)
        if self.hosts_engine:
            assert self.loop is not None
            if asleep:
                self.loop.call(self.engine.wake_up(tags=["kv_cache"]))
            if not self.loop.call(self.engine.reset_prefix_cache()):
                raise RuntimeError("vLLM did not reset its prefix cache: requests in flight?")
        self.awake, self.weights_valid = True, True

    def _push_local(self, model: torch.nn.Module) -> None:
        """Colocated: this rank's engine reads each gathered bucket, by CUDA IPC from this
        GPU's memory, or inline (an engine on the CPU)."""
        assert self.loop is not None
        client = SyncClient(self.api, self.loop, self.engine)
        if self._channel is None:  # first push: the handshake (no rendezvous needed)
            client.init_weight_transfer_engine({"packed": False} if self.transfer == "ipc" else {})
            self._channel = True
        client.start_weight_update()
        weights = full_parameters(model, self.dtype, aliases=True)  # lm_head too (weights.py)
        for bucket in buckets(weights, self.bucket_bytes):
            names = [n for n, _ in bucket]
            tensors = [tensor.contiguous() for _, tensor in bucket]  # alive until loaded
            client.update_weights(self.bucket_payload(names, tensors))
            del tensors
        client.finish_weight_update()
        if self.transfer == "ipc":
            torch.cuda.ipc_collect()  # free the buckets the engine has let go of

    def bucket_payload(self, names: list[str], tensors: list[torch.Tensor]) -> dict[str, Any]:
        if self.transfer == "ipc":
            return self.ipc_payload(names, tensors)
        from trainer.backends import vllm_inline

        return vllm_inline.payload(names, tensors)

    def ipc_payload(self, names: list[str], tensors: list[torch.Tensor]) -> dict[str, Any]:
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.synchronize()  # the gathered copies exist before another process reads them
        device = tensors[0].device.index if tensors else torch.cuda.current_device()
        gpu = str(torch.cuda.get_device_properties(device).uuid)
        handles = [{gpu: reduce_tensor(tensor)[1]} for tensor in tensors]
        return {
            "names": names,
            "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors],
            "shapes": [list(t.shape) for t in tensors],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
        }

    def _push_nccl(self, model: torch.nn.Module) -> None:
        """Separate: rank 0 broadcasts to the engine's workers; every rank joins the gathers."""
        if self._channel is None:
            self._channel = self._nccl_sender(model)
        self._channel.send_weights()

    def _nccl_sender(self, model: torch.nn.Module) -> Any:
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        c = self.config
        workers = c.tensor_parallel_size * c.data_parallel_size
        info = NCCLTrainerInitInfo(
            master_address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=c.nccl_port,
            world_size=1 + workers,  # the sender, rank 0, then every engine worker
            rank=self.dp.rank,
            packed_buffer_size_bytes=self.bucket_bytes,
        )
        client: Any = None
        if self.hosts_engine:
            assert self.loop is not None
            client = SyncClient(self.api, self.loop, self.engine)
        source = policy_source(model, self.dtype)
        return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)


def policy_source(model: torch.nn.Module, dtype: torch.dtype) -> Any:
    """A vLLM ``WeightSource`` over ``weights.full_parameters``: every rank yields every
    parameter (gathering it), in the engine's dtype."""
    from vllm.distributed.weight_transfer import ParamMeta, WeightSource

    class PolicySource(WeightSource):
        @cached_property
        def metadata(self) -> list[Any]:
            return [ParamMeta(n, d, s) for n, d, s in parameter_specs(model, dtype, aliases=True)]

        def iter_full(self) -> Iterator[Named]:
            yield from full_parameters(model, dtype, aliases=True)

    return PolicySource()
