"""SFT data in the formats it comes in, as the message lists ``chat.conversation_segments`` renders.

The recipe's warm start is non-reasoning SFT on function-calling, instruction-following and chat
data. Such data comes as rows of one of these shapes (``sft.format``, or ``auto``: by the keys
of each row):

- ``messages`` (OpenAI chat format, and ours): ``{"messages": [...], "tools": [...]}``. Roles
  ``system`` (or ``developer``), ``user``, ``assistant``, ``tool`` (or legacy ``function``);
  an assistant message may carry ``tool_calls`` (``[{"function": {"name", "arguments"}}]``,
  arguments a JSON string or an object) or a legacy ``function_call``; content may be a
  string, null, or a list of ``{"type": "text", "text"}`` parts. ``tools`` (or legacy
  ``functions``) are the schemas.
- ``sharegpt``: ``{"conversations": [{"from", "value"}], "system": ..., "tools": ...}``, with
  ``from`` one of ``system``, ``human``/``user``, ``gpt``/``assistant``, ``function_call`` (the
  value a JSON call or list of calls), ``observation``/``tool`` (a tool's result): the format
  of LLaMA-Factory's and most converted function-calling sets (glaive-function-calling,
  ToolACE, ...).
- ``xlam``: ``{"query", "tools", "answers"}`` (xlam-function-calling-60k and its kind): one
  user turn answered by calls, with no results.

Every shape becomes: an optional system message, then user / assistant / tool messages, where an
assistant message is ``{"role", "content", "tool_calls": [{"name", "arguments"}]}`` and a tool
message's content is text (JSON results are dumped). A row that names tools gets a system prompt
offering them in ``<tools>`` (``tools.tools_system_prompt``, after the row's own system text if
it has one); a row with neither tools nor a system prompt gets the RL system prompt. Rows with no
assistant turn, and trailing turns after the last assistant one, are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from trainer.problems import read_rows
from trainer.tools import tools_system_prompt

SftFormat = Literal["auto", "messages", "sharegpt", "xlam"]
Message = dict[str, Any]

OPENAI_ROLES = {"function": "tool", "developer": "system"}  # legacy and newer names
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def load_sft_rows(path: str | Path, fmt: SftFormat = "auto") -> list[list[Message]]:
    """The conversations of a ``.jsonl`` / ``.json`` / ``.parquet`` file of any known format."""
    conversations = []
    for i, row in enumerate(read_rows(path)):
        try:
            messages = to_messages(row, fmt)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: row {i}: {exc}") from exc
        if messages:
            conversations.append(messages)
    if not conversations:
        raise ValueError(f"{path}: no conversation with an assistant turn")
    return conversations


def detect_format(row: dict[str, Any]) -> SftFormat:
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "query" in row and "answers" in row:
        return "xlam"
    raise ValueError(f"unknown SFT row shape (keys {sorted(row)})")


def to_messages(row: dict[str, Any], fmt: SftFormat = "auto") -> list[Message]:
    """One row as a conversation (empty when it has no assistant turn)."""
    fmt = detect_format(row) if fmt == "auto" else fmt
    if fmt == "messages":
        tools = row.get("tools") or row.get("functions")  # legacy: bare function schemas
        messages = [_openai_message(m) for m in row["messages"]]
    elif fmt == "sharegpt":
        tools = row.get("tools")
        messages = [_sharegpt_message(m) for m in row["conversations"]]
        if row.get("system"):
            messages.insert(0, {"role": "system", "content": row["system"]})
    else:
        tools = row["tools"]
        messages = [
            {"role": "user", "content": row["query"]},
            {"role": "assistant", "content": "", "tool_calls": _calls(_json(row["answers"]))},
        ]
    return _with_tools(_merged(messages), _schemas(_json(tools)))


def _json(value: Any) -> Any:
    """Datasets often store nested values as JSON strings."""
    return json.loads(value) if isinstance(value, str) and value.strip() else value


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return json.dumps(content)


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    return {"name": function["name"], "arguments": _json(function.get("arguments", {}))}


def _calls(value: Any) -> list[dict[str, Any]]:
    calls = value if isinstance(value, list) else [value]
    return [_call(c) for c in calls]


def _openai_message(message: dict[str, Any]) -> Message:
    role = OPENAI_ROLES.get(message["role"], message["role"])
    out: Message = {"role": role, "content": _text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if message.get("function_call"):
        calls = [message["function_call"]]
    if calls:
        out["tool_calls"] = _calls(calls)
    return out


def _sharegpt_message(message: dict[str, Any]) -> Message:
    source = message["from"]
    if source not in SHAREGPT_ROLES:
        raise ValueError(f"unknown ShareGPT role {source!r}")
    if source == "function_call":
        return {"role": "assistant", "content": "", "tool_calls": _calls(_json(message["value"]))}
    return {"role": SHAREGPT_ROLES[source], "content": _text(message["value"])}


def _merged(messages: Iterable[Message]) -> list[Message]:
    """Consecutive assistant messages as one (ShareGPT writes a turn's words and its call
    apart), and nothing after the last assistant message."""
    out: list[Message] = []
    for message in messages:
        if out and message["role"] == out[-1]["role"] == "assistant":
            last = out[-1]
            last["content"] += message["content"]
            last["tool_calls"] = last.get("tool_calls", []) + message.get("tool_calls", [])
        else:
            out.append(dict(message))
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out


def _schemas(tools: Any) -> list[dict[str, Any]]:
    """OpenAI tool schemas; a bare function description (xLAM, ShareGPT) is wrapped."""
    if not tools:
        return []
    tools = tools if isinstance(tools, list) else [tools]
    return [
        t if t.get("type") == "function" else {"type": "function", "function": t} for t in tools
    ]


def _with_tools(messages: list[Message], schemas: list[dict[str, Any]]) -> list[Message]:
    if not messages or not schemas:
        return messages
    if messages[0]["role"] == "system":
        system, rest = messages[0]["content"], messages[1:]
    else:
        system, rest = None, messages
    return [{"role": "system", "content": tools_system_prompt(schemas, system)}, *rest]
