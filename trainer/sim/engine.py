"""A simulated serving engine: continuous batching over a paged KV cache, on simulated time.

It is a :class:`GenerationBackend` that also reports its KV cache
(:class:`~trainer.placement.ReportsKvCapacity`), so the real scheduler drives it as it would
drive vLLM. What it models, after vLLM's scheduler:

- **Admission.** A waiting request starts when its context (plus one token) fits in the blocks
  running requests do not hold, and fewer than ``max_seqs`` run; first come, first served.
- **Decode.** Every running request gets one token per step. A step costs a fixed part (the
  weights are read once per step) plus a part per token of every running request's context
  (its KV cache is read), so a step slows as contexts grow; prefill of new context costs per
  token, added to the step that admits it.
- **Prefix cache.** When a request finishes, its blocks stay cached (evictable, so counted
  as free) under its rollout; the rollout's next turn on the same engine prefills only what
  is new (its tool response), on another engine the whole context.
- **Overflow.** When the running requests' contexts outgrow the cache, the most recently
  admitted is preempted: its blocks are dropped, it waits again at the head of the queue, and
  its whole context is recomputed when it is readmitted (vLLM's recompute preemption).

A request's ``prompt_ids`` must be a :class:`PlannedContext`: a length, the rollout it belongs
to, and what the "model" writes next (the simulation decides lengths, not a model). Time
advances in events of at most ``steps_per_event`` decode steps; a request that arrives in the
middle of one is admitted at its end.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from trainer.backends.base import (
    FinishReason,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from trainer.placement import KvCapacity


@dataclass(frozen=True)
class EngineModel:
    """An engine's memory and speed. The defaults are one MI300X-class GPU (192 GB, ~5.3 TB/s)
    serving a 14B model in bf16, the report's setting, roughly: ~130 GB of KV cache at
    160 KiB per token (Qwen3-14B: 40 layers, 8 KV heads of 128); a decode step reads the
    29.5 GB of weights and every running token's KV at ~3.5 TB/s effective; prefill at
    ~520 TFLOP/s effective, 2 x 14.8 GFLOP per token."""

    kv_blocks: int = 49_152  # x block_size = 786,432 tokens
    block_size: int = 16
    max_seqs: int = 256
    decode_step_s: float = 0.0085
    kv_read_s: float = 4.7e-8  # per context token per decode step
    prefill_token_s: float = 5.7e-5
    steps_per_event: int = 4

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@dataclass(frozen=True)
class PlannedContext(Sequence[int]):
    """Stands for a context's token ids: the engine reads only its length, its rollout, and
    what the model will write next (``planned`` tokens, ending in ``reason``)."""

    rollout: int
    length: int
    planned: int
    reason: FinishReason

    def __len__(self) -> int:
        return self.length

    def extended(self, generated: Sequence[int]) -> PlannedContext:
        """The context after ``generated`` (a chunk of the planned turn)."""
        n = len(generated)
        return PlannedContext(self.rollout, self.length + n, self.planned - n, self.reason)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # never read for content
        raise TypeError("a simulated context has a length, not token ids")

    def __iter__(self) -> Iterator[int]:
        raise TypeError("a simulated context has a length, not token ids")


@dataclass(eq=False)
class _Running:
    rollout: int
    context: int  # tokens whose KV the request needs now (prompt + generated so far)
    remaining: int
    reason: FinishReason
    future: asyncio.Future[Generation]
    generated: int = 0


@dataclass
class EngineCounters:
    busy_s: float = 0.0  # time with at least one request running
    preemptions: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0  # context found in the prefix cache instead of recomputed
    max_running: int = 0


class SimEngine(GenerationBackend):
    continuous_batching = True

    def __init__(self, model: EngineModel, turn_ends: dict[int, float] | None = None) -> None:
        """``turn_ends``: where to note, per rollout, when its latest turn was generated."""
        self.model = model
        self.counters = EngineCounters()
        self.turn_ends = {} if turn_ends is None else turn_ends
        self._running: list[_Running] = []  # in admission order
        self._waiting: collections.deque[_Running] = collections.deque()
        self._cache: collections.OrderedDict[int, int] = collections.OrderedDict()  # LRU, blocks
        self._cached_blocks = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def kv_capacity(self) -> KvCapacity:
        return KvCapacity(
            self.model.block_size,
            self.model.kv_blocks,
            self.model.kv_blocks - self._used_blocks(),
            self.model.max_seqs,
        )

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve())
        futures = []
        for request in requests:
            context = request.prompt_ids
            if not isinstance(context, PlannedContext):
                raise TypeError("SimEngine takes PlannedContext prompts")
            tokens, reason = context.planned, context.reason
            if tokens > request.max_new_tokens:
                tokens, reason = request.max_new_tokens, "length"
            future: asyncio.Future[Generation] = loop.create_future()
            self._waiting.append(_Running(context.rollout, len(context), tokens, reason, future))
            futures.append(future)
        assert self._wake is not None
        self._wake.set()
        return [await future for future in futures]

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- the engine's own loop

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            prefill = self._admit()
            if not self._running:
                raise RuntimeError("a waiting request can never fit in this engine's KV cache")
            steps = min(self.model.steps_per_event, min(r.remaining for r in self._running))
            duration = self._duration(steps, prefill)
            await asyncio.sleep(duration)
            self.counters.busy_s += duration
            self._decode(steps)
            self._preempt_overflow()

    def _duration(self, steps: int, prefill: int) -> float:
        m, batch = self.model, len(self._running)
        context = sum(r.context for r in self._running)
        kv_tokens_read = steps * context + batch * steps * (steps - 1) / 2
        return steps * m.decode_step_s + kv_tokens_read * m.kv_read_s + prefill * m.prefill_token_s

    def _admit(self) -> int:
        """Start waiting requests while they fit; the context tokens that must be prefilled."""
        prefill, used = 0, self._used_blocks()
        while self._waiting and len(self._running) < self.model.max_seqs:
            request = self._waiting[0]
            need = self.model.blocks(request.context + 1)
            if used + need > self.model.kv_blocks:
                break
            self._waiting.popleft()
            cached = self._cache.pop(request.rollout, 0)
            self._cached_blocks -= cached
            # Only whole blocks are shared, as in vLLM.
            reused = min(cached * self.model.block_size, request.context)
            reused -= reused % self.model.block_size
            prefill += request.context - reused
            self.counters.reused_tokens += reused
            self._running.append(request)
            used += self.model.blocks(request.context)
        self.counters.prefill_tokens += prefill
        self.counters.max_running = max(self.counters.max_running, len(self._running))
        self._evict(used)
        return prefill

    def _decode(self, steps: int) -> None:
        now = asyncio.get_running_loop().time()
        still = []
        for request in self._running:
            request.context += steps
            request.generated += steps
            request.remaining -= steps
            if request.remaining > 0:
                still.append(request)
                continue
            # Whole blocks stay cached under the rollout (a newer turn's prefix replaces an
            # older one; its rollout moves on and never needs the older one again).
            self._cached_blocks -= self._cache.pop(request.rollout, 0)
            self._cache[request.rollout] = request.context // self.model.block_size
            self._cached_blocks += self._cache[request.rollout]
            self.turn_ends[request.rollout] = now
            n = request.generated
            request.future.set_result(Generation([0] * n, [0.0] * n, request.reason))
        self._running = still

    def _preempt_overflow(self) -> None:
        used = self._used_blocks()
        while used > self.model.kv_blocks and len(self._running) > 1:
            victim = self._running.pop()
            used -= self.model.blocks(victim.context)
            self._waiting.appendleft(victim)
            self.counters.preemptions += 1
        self._evict(used)

    def _evict(self, used: int) -> None:
        """Drop the least recently used cached prefixes until running and cached blocks fit."""
        while self._cache and used + self._cached_blocks > self.model.kv_blocks:
            _, blocks = self._cache.popitem(last=False)
            self._cached_blocks -= blocks

    def _used_blocks(self) -> int:
        return sum(self.model.blocks(r.context) for r in self._running)
