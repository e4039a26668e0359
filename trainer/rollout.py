"""The agent loop: multi-turn rollouts on token ids, with tool calls executed in batches.

A turn generates until ``</tool_call>`` (kept) or end of sequence; the calls it wrote are
executed and each response is formatted, tokenised on its own and appended. Nothing already
in a transcript is ever re-tokenised: the policy is trained on exactly the ids it produced and
the ids it was shown. Model tokens get loss mask 1, tool-turn tokens 0.

Where and when turns run is ``trainer/scheduler.py``'s business: in rounds (every unfinished
rollout generates a turn, then all calls of the round go to the runner in one batch while
finished rollouts wait), or, with ``settings.scheduling``, each rollout at its own pace: its
calls are sent the moment its turn ends (gathered with others' by a short window), and its
next turn goes to an engine chosen by free KV cache (``balanced``) or always the same one
(``static``). This module only says what a turn does to a transcript.

A rollout ends at end of sequence (its answer is final), or is *truncated* (reward 0) when it
runs out of tokens (``max_response_tokens`` counts model and tool tokens after the prompt) or
out of turns (``max_turns`` assistant turns and the last one still called a tool).

Per rollout it records what Resample-on-Correct and the metrics need: assistant turns, tool
calls, tool errors (a parse error, a status other than ok, or a Python error in the output),
and the ``<answer>`` tags of the model's own text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

from sandbox_service.models import ExecuteRequest, ExecuteResult, Mode
from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.chat import decode, tool_turn_text
from trainer.placement import RolloutScheduler, SchedulerSettings
from trainer.roc import RocSample
from trainer.scheduler import DriverMeter, metered, run_async, run_in_rounds
from trainer.tool_dispatch import ToolDispatcher, ToolRunner
from trainer.tools import (
    CALL_CLOSE,
    ParsedCall,
    PromptStyle,
    ToolCall,
    ToolCallError,
    TruncateSide,
    answer_tags,
    is_tool_error,
    parse_tool_calls,
    render_result,
    truncate,
)

Finish = Literal["running", "eos", "length", "max_turns"]


@dataclass(frozen=True)
class RolloutSettings:
    max_turns: int
    max_response_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    tool_timeout_s: float = 10.0
    tool_memory_mb: int = 1024
    tool_mode: Mode = Mode.repl
    max_tool_response_chars: int = 2048
    truncate_side: TruncateSide = "middle"
    scheduling: SchedulerSettings | None = None  # None: in rounds
    tool_batch_size: int = 64  # asynchronous tools: a batch request leaves at this many calls
    tool_batch_timeout_s: float = 0.01  # ... or this long after its oldest call arrived
    prompt_style: PromptStyle = "plain"  # how tool turns are written (chat.tool_turn_text)


@dataclass
class Rollout:
    """One transcript: the prompt, then the response (model turns and tool turns) with masks."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # per response token: 1 model, 0 tool
    logprobs: list[float] = field(default_factory=list)  # sampling logprobs; 0.0 on tool tokens
    model_turns: list[str] = field(default_factory=list)  # decoded text of each model turn
    tool_turns: list[str] = field(default_factory=list)  # the text of each tool turn
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    finish: Finish = "running"

    @property
    def truncated(self) -> bool:
        return self.finish in ("length", "max_turns")

    @property
    def model_text(self) -> str:
        return "".join(self.model_turns)

    @property
    def response_text(self) -> str:
        """The response as text, model and tool turns in order (what the release decodes)."""
        tools = [*self.tool_turns, *[""] * (len(self.model_turns) - len(self.tool_turns))]
        return "".join(m + t for m, t in zip(self.model_turns, tools, strict=True))

    def roc_sample(self, reward: float) -> RocSample:
        tags = answer_tags(self.model_text)
        return RocSample(
            reward=reward,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            answers=tags.closed,
            answer_tags_balanced=tags.balanced,
            turns=self.turns,
            response_text=self.response_text,
        )

    def add_tokens(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1 if logprobs is not None else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


async def generate_rollouts(
    prompts: Sequence[Sequence[int]],
    backend: GenerationBackend | Sequence[GenerationBackend],
    tokenizer: PreTrainedTokenizerBase,
    runner: ToolRunner,
    settings: RolloutSettings,
    meter: DriverMeter | None = None,
) -> list[Rollout]:
    """Run every prompt to the end; one rollout per prompt, in order. ``backend``: one engine
    or several (rollouts are spread over them as ``settings.scheduler`` says); ``meter``
    records engine busy time and tool wait."""
    rollouts = [Rollout(prompt_ids=list(p)) for p in prompts]
    agents = [_Transcript(r, tokenizer, settings) for r in rollouts]
    served = [backend] if isinstance(backend, GenerationBackend) else list(backend)
    engines = [metered(e) for e in served]
    params = SamplingParams(settings.temperature, settings.top_p, stop=(CALL_CLOSE,))
    loop = asyncio.get_running_loop()
    start = loop.time()
    if settings.scheduling is None:
        waited = await run_in_rounds(agents, engines, runner, params)
    else:
        waited = await run_async(
            agents,
            RolloutScheduler(engines, params, settings.scheduling),
            ToolDispatcher(runner, settings.tool_batch_size, settings.tool_batch_timeout_s),
        )
    if meter is not None:
        meter.record(loop.time() - start, engines, waited, len(agents))
    return rollouts


class _Transcript:
    """A rollout as the scheduler drives it (``trainer.scheduler.Agent``)."""

    def __init__(
        self, rollout: Rollout, tokenizer: PreTrainedTokenizerBase, settings: RolloutSettings
    ) -> None:
        self.rollout, self.tokenizer, self.settings = rollout, tokenizer, settings
        self.calls: list[ParsedCall] = []  # the calls of the turn awaiting its results

    def next_request(self) -> GenerationRequest:
        r = self.rollout
        return GenerationRequest(
            prompt_ids=r.prompt_ids + r.response_ids,
            max_new_tokens=self.settings.max_response_tokens - len(r.response_ids),
        )

    def take_generation(self, generation: Generation) -> list[ExecuteRequest] | None:
        calls = _take_turn(self.rollout, generation, self.tokenizer, self.settings)
        if calls is None:
            return None
        self.calls = calls
        s = self.settings
        return [
            call.request(s.tool_timeout_s, s.tool_memory_mb, s.tool_mode)
            for call in calls
            if isinstance(call, ToolCall)
        ]

    def take_results(self, results: list[ExecuteResult]) -> bool:
        _append_tool_turn(self.rollout, self.calls, results, self.tokenizer, self.settings)
        return self.rollout.finish == "running"


def _take_turn(
    rollout: Rollout,
    generation: Generation,
    tokenizer: PreTrainedTokenizerBase,
    settings: RolloutSettings,
) -> list[ParsedCall] | None:
    """Append one model turn; the calls it made, or None when the rollout ended with it."""
    rollout.add_tokens(generation.token_ids, generation.logprobs)
    text = decode(tokenizer, generation.token_ids)
    rollout.model_turns.append(text)
    rollout.turns += 1
    if generation.finish_reason == "eos":
        rollout.finish = "eos"
        return None
    if (
        generation.finish_reason == "length"
        or len(rollout.response_ids) >= settings.max_response_tokens
    ):
        rollout.finish = "length"
        return None
    if rollout.turns >= settings.max_turns:
        rollout.finish = "max_turns"  # it still wants the tool, but has no turn left to use it
        return None
    calls = parse_tool_calls(text)
    # A stop string with no complete block before it (a lone "</tool_call>") still ends the
    # turn; the model is told, as for any malformed call.
    return calls or [
        ToolCallError("Failed to decode tool call: no <tool_call> before </tool_call>")
    ]


def _append_tool_turn(
    rollout: Rollout,
    calls: list[ParsedCall],
    results: Iterable[ExecuteResult],
    tokenizer: PreTrainedTokenizerBase,
    settings: RolloutSettings,
) -> None:
    """Append the tool turn answering ``calls`` (``results``: those of its well-formed calls,
    in order), or end the rollout if the turn does not fit in its token budget."""
    executed, texts = iter(results), []
    for call in calls:
        if isinstance(call, ToolCallError):
            texts.append(call.message)
            rollout.tool_errors += 1
        else:
            result = next(executed)
            texts.append(render_result(result))
            rollout.tool_errors += is_tool_error(result)
        rollout.tool_calls += 1
    texts = [truncate(t, settings.max_tool_response_chars, settings.truncate_side) for t in texts]
    text = tool_turn_text(texts, settings.prompt_style)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(rollout.response_ids) + len(ids) >= settings.max_response_tokens:
        rollout.finish = "length"  # no room left to read the response and answer
        return
    rollout.add_tokens(ids, None)
    rollout.tool_turns.append(text)
