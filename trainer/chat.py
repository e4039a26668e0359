"""ChatML turns as text: the prompt, the tool-response turn, whole conversations for SFT.

The format of Qwen (the report's model family): ``<|im_start|>role\\ncontent<|im_end|>\\n``.
Tool results come back in a *user* turn of ``<tool_response>`` blocks, as in the release's chat
template. RL and SFT build their text with the same functions here, so a model fine-tuned on
transcripts sees exactly the token pieces the rollout loop will feed it.

Two prompt styles (``prompt.style``). ``plain``: our tool description, assistant turns opened
bare. ``release``: the release's chat template to the character: its tool description, every
assistant turn opened with ``<reason>`` (its generation prompt), and a tool turn that follows
the model's end-of-turn token with no newline (the release appends the template's rendering of
the tool messages, which starts at ``<|im_start|>user``, right after the generated ids).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from trainer.tools import PromptStyle, format_call, response_block, system_prompt

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
PAD = "<|endoftext|>"
# The end of an assistant turn: the policy's end-of-sequence token.
EOS = IM_END


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Token ids as text with every marker kept (``<tool_call>``, ``<|im_end|>``, ...)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    assert isinstance(text, str)
    return text


def assistant_opening(style: PromptStyle = "plain") -> str:
    """What opens every assistant turn; the model writes what follows."""
    return f"{IM_START}assistant\n" + ("<reason>" if style == "release" else "")


def prompt_text(user: str, system: str | None = None, style: PromptStyle = "plain") -> str:
    """The first prompt of a rollout: system turn, user turn, and the opened assistant turn."""
    system = system_prompt(style) if system is None else system
    return (
        f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{user}{IM_END}\n"
        + assistant_opening(style)
    )


def tool_turn_text(responses: Sequence[str], style: PromptStyle = "plain") -> str:
    """What follows an assistant turn that ended in ``</tool_call>``.

    It closes that turn, gives one ``<tool_response>`` block per call in a user turn, and opens
    the next assistant turn. None of it is the model's: all of it gets loss mask 0.
    """
    body = "\n".join(response_block(text) for text in responses)
    after_turn = "" if style == "release" else "\n"
    return f"{IM_END}{after_turn}{IM_START}user\n{body}{IM_END}\n" + assistant_opening(style)


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered conversation and whether the model is trained to write it."""

    text: str
    trainable: bool


def assistant_text(message: Mapping[str, Any], style: PromptStyle = "plain") -> str:
    """An assistant message as the model writes it: its ``content``, then its ``tool_calls``
    (each ``{"name", "arguments"}``; ``sft_data`` brings every format to that)."""
    calls = message.get("tool_calls") or ()
    return (message.get("content") or "") + "".join(
        format_call(call["name"], call["arguments"], style) for call in calls
    )


def conversation_segments(
    messages: Sequence[Mapping[str, Any]], style: PromptStyle = "plain"
) -> list[Segment]:
    """A tool-use conversation as segments; only the assistant's own words are trainable.

    ``messages``: an optional ``system`` message, a ``user`` message, then ``assistant``
    messages, each followed by ``tool`` messages (one per call it made), by a ``user`` message,
    or by nothing (the last). An assistant message that calls a tool ends with
    ``</tool_call>``; the ``<|im_end|>`` after it is the environment's (as in a rollout, where
    generation stops at the stop string). Without a system message the RL system prompt (our
    tool's) is used.
    """
    messages = list(messages)
    system = messages.pop(0)["content"] if messages and messages[0]["role"] == "system" else None
    if not messages or messages[0]["role"] != "user":
        raise ValueError("a conversation starts with an optional system message, then a user one")
    segments = [Segment(prompt_text(messages[0]["content"], system, style), trainable=False)]
    i = 1
    while i < len(messages):
        message = messages[i]
        if message["role"] != "assistant":
            raise ValueError(f"message {i}: expected an assistant message, got {message['role']!r}")
        segments.append(Segment(assistant_text(message, style), trainable=True))
        j = i + 1
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            tool_texts = [m["content"] for m in messages[i + 1 : j]]
            segments.append(Segment(tool_turn_text(tool_texts, style), trainable=False))
        elif j < len(messages) and messages[j]["role"] == "user":
            segments.append(Segment(IM_END, trainable=True))
            user = f"\n{IM_START}user\n{messages[j]['content']}{IM_END}\n"
            opener = user + assistant_opening(style)
            segments.append(Segment(opener, trainable=False))
            j += 1
        elif j == len(messages):  # after a call nobody answered, the end is not the model's
            segments.append(Segment(IM_END, trainable=not message.get("tool_calls")))
        i = j
    return segments


# The same format as a Jinja chat template, for tokenizers built here (``tiny``): with it,
# ``apply_chat_template`` renders a conversation exactly as ``conversation_segments`` does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{- '<|im_start|>user\\n' -}}"
    "{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
