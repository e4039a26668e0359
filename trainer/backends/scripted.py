"""A backend that plays a scripted policy: text chosen by a function of the transcript so far.

For tests and for exercising the tool path end to end (a real service, real executions)
without a trained model. The script sees the decoded transcript and the turn number and
returns the next turn's text; the backend tokenises it and applies the same stop rules as a
real engine: cut after the first stop string (kept), end at the end-of-sequence token, or at
the token budget. Every token gets logprob 0.0 (the script is certain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from trainer.backends.base import (
    FinishReason,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from trainer.chat import decode

Script = Callable[[str, int], str]  # (transcript so far, turn index from 0) -> next turn


class ScriptedBackend(GenerationBackend):
    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: Script) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.calls: list[int] = []  # batch size of every generate call

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        self.calls.append(len(requests))
        return [self._one(request, params) for request in requests]

    def _one(self, request: GenerationRequest, params: SamplingParams) -> Generation:
        transcript = decode(self.tokenizer, request.prompt_ids)
        turn = transcript.count("<|im_start|>assistant") - 1
        text = self.script(transcript, turn)
        reason: FinishReason = "length"
        for stop in params.stop:
            if stop in text:
                text, reason = text[: text.index(stop) + len(stop)], "stop"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        if reason == "length" and eos in ids:
            ids, reason = ids[: ids.index(eos) + 1], "eos"
        if len(ids) > request.max_new_tokens:
            ids, reason = ids[: request.max_new_tokens], "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=reason)
