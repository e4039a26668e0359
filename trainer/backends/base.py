"""The generation interface the rollout loop needs, and nothing more.

A backend continues token-id prompts. It never sees text it has to tokenise, so what the
policy is trained on is exactly what it generated. Stop strings end a generation with the stop
string kept (``</tool_call>``, so the call is complete in the transcript); so does the
end-of-sequence token. The interface is async because a serving engine (vLLM) generates for
many requests while the caller waits on others; ``update_weights`` is where such an engine
receives the policy after each optimizer step, and ``offload`` where it makes room for the
update on a GPU it shares with the trainer. An engine with a KV cache can also report its
free capacity to the rollout scheduler (``trainer.placement.ReportsKvCapacity``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: Sequence[int]
    max_new_tokens: int


@dataclass(frozen=True)
class Generation:
    """What a request produced.

    ``finish_reason``: ``stop`` (a stop string was generated; it is the end of ``token_ids``),
    ``eos`` (the end-of-sequence token, kept as the last id), or ``length`` (``max_new_tokens``
    reached). ``logprobs[i]`` is the sampling distribution's log-probability of
    ``token_ids[i]``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class GenerationBackend(ABC):
    # True when ``generate`` may be called again before earlier calls return and the engine
    # batches what is running itself (continuous batching: vLLM); the rollout scheduler then
    # sends each turn as it comes. False: each call is one batch (transformers), and the
    # scheduler gathers the turns that are ready into the next call.
    continuous_batching: bool = False

    # True: every data-parallel rank has its own backend and generates its share of a step;
    # False: only rank 0's generates, and the other ranks receive its rollouts.
    per_rank: bool = True

    @abstractmethod
    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        """One generation per request, in order."""

    def offload(self) -> None:  # noqa: B027 - optional hook
        """The step's rollouts are done: free what the update needs (an engine sharing the
        GPU with the trainer sleeps). The next ``update_weights`` or ``generate`` wakes it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """The run is over: stop what the backend started (an engine's processes)."""

    def update_weights(self, model: torch.nn.Module, changed: bool = True) -> None:  # noqa: B027
        """Called after every step, on every rank: receive the policy's weights if they
        ``changed`` (and whatever an offloaded engine lost). A backend that shares the module
        needs nothing."""
