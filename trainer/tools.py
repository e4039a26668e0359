"""The tool protocol: the system prompt, ``<tool_call>`` parsing, ``<tool_response>`` text, answers.

The model has one tool, ``python_code_with_standard_io(code, input)`` (the rStar2-Agent tool),
and calls it by writing::

    <tool_call>{"name": "python_code_with_standard_io",
                "arguments": {"code": "print(6 * 7)", "input": ""}}</tool_call>

Whatever the model writes between the tags, :func:`parse_tool_calls` answers with either a
:class:`ToolCall` to execute or a :class:`ToolCallError` whose message goes back to the model as
the tool's response (the release's ``rstar2_agent_hermes`` parser does the same): malformed JSON,
a wrong tool name or missing arguments teach the model the format, they never crash a rollout.

Everything here is text in, text out; the rollout loop turns it into token ids, and ``chat``
knows the turn markers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sandbox_service.math_answer import ANSWER_BLOCK
from sandbox_service.models import ExecuteRequest, ExecuteResult, Mode, Status

TOOL_NAME = "python_code_with_standard_io"
TOOL_SCHEMA: dict[str, object] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run a Python program with the given standard input and return what it printed "
            "to standard output and standard error."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python program to run."},
                "input": {"type": "string", "description": "Text given on standard input."},
            },
            "required": ["code", "input"],
        },
    },
}

# The same tool as the release describes it (rStar's rstar2_agent/config/tool_config/
# python_tool_config.yaml, keys in the order verl's schema model dumps them): the text a
# released checkpoint was trained to read.
RELEASE_TOOL_SCHEMA: dict[str, object] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Execute Python code with standard input and capture standard output. This function "
            "takes a Python code string and an input string, provides the input string through "
            "standard input (stdin) to the code, and captures and returns any output produced "
            "through standard output (stdout). If the executed code raises an exception, the "
            "error message will be captured and returned instead."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": (
                        "A string containing Python code to be executed. The code can read "
                        "from standard input using the input() function."
                    ),
                },
                "input": {
                    "type": "string",
                    "description": (
                        "A string that will be provided as standard input to the code when it "
                        "calls input()."
                    ),
                },
            },
            "required": ["code", "input"],
        },
    },
}

# ``plain``: the system prompt below with our own tool description. ``release``: the release's
# chat template exactly (its custom_chat_template in rstar2_agent_trainer.yaml): its tool
# description, and every assistant turn opened with ``<reason>`` (chat.py).
PromptStyle = Literal["plain", "release"]


# The release's default system prompt (its chat template's), before the tools.
PREAMBLE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process in the mind and then "
    "provides the User with the answer. The reasoning process is enclosed within <reason> "
    "</reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
    "<reason> reasoning process here </reason> <answer> answer here </answer>."
)


def _system_prompt(schemas: Sequence[dict[str, object]], preamble: str = PREAMBLE) -> str:
    """The release's system prompt: the preamble, then the schemas in <tools>, one a line."""
    return (
        preamble + "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        + "\n".join(json.dumps(schema) for schema in schemas)
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


SYSTEM_PROMPT = _system_prompt([TOOL_SCHEMA])
RELEASE_SYSTEM_PROMPT = _system_prompt([RELEASE_TOOL_SCHEMA])

# The release puts this instruction in front of every problem.
PROBLEM_PREFIX = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here "
    "</answer>. And your final answer will be extracted automatically by the \\boxed{} tag.\n"
    "This is the problem:\n"
)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
# What counts as "an error in the output" of a run that exited 0 (the release counts any
# response containing "error"; we look for Python's own error lines, so printing the word
# "error" as data is not a tool error).
OUTPUT_ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)

TruncateSide = Literal["left", "right", "middle"]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of the one tool."""

    code: str
    stdin: str = ""

    def request(self, timeout_s: float, memory_mb: int, mode: Mode = Mode.repl) -> ExecuteRequest:
        """The service request; ``repl`` (the default) prints the repr of a final expression,
        as the release's tool does."""
        return ExecuteRequest(
            code=self.code, stdin=self.stdin, timeout_s=timeout_s, memory_mb=memory_mb, mode=mode
        )


@dataclass(frozen=True)
class ToolCallError:
    """A call that could not be understood; ``message`` is what the model is told."""

    message: str


ParsedCall = ToolCall | ToolCallError


def system_prompt(style: PromptStyle = "plain") -> str:
    return RELEASE_SYSTEM_PROMPT if style == "release" else SYSTEM_PROMPT


def user_prompt(problem: str) -> str:
    return PROBLEM_PREFIX + problem


def format_tool_call(code: str, stdin: str = "") -> str:
    """The text of a well-formed call: what SFT transcripts and scripted policies write."""
    return format_call(TOOL_NAME, {"code": code, "input": stdin})


def format_call(name: str, arguments: object, style: PromptStyle = "plain") -> str:
    """The text of a call of any tool (SFT data calls others than ours).

    ``plain``: ``<tool_call>{json}</tool_call>``, with ``</`` written ``<\\/`` (valid JSON for
    the same string), so an argument that mentions ``</tool_call>`` cannot end the call early.
    ``release``: as the release's chat template writes a call, on lines of its own.
    """
    if style == "release":
        call = f'{{"name": "{name}", "arguments": {json.dumps(arguments)}}}'
        return f"\n{CALL_OPEN}\n{call}\n{CALL_CLOSE}"
    body = json.dumps({"name": name, "arguments": arguments}).replace("</", "<\\/")
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def tools_system_prompt(schemas: Sequence[dict[str, object]], preamble: str | None = None) -> str:
    """A system prompt that offers ``schemas`` (OpenAI tool schemas) in ``<tools>``, in the
    release's (Qwen's) words; ``preamble``: what comes first (the release's by default)."""
    return _system_prompt(schemas, PREAMBLE if preamble is None else preamble)


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """Every closed ``<tool_call>...</tool_call>`` block of ``text``, in order, parsed.

    An unclosed ``<tool_call>`` (a turn cut off by the length limit) is not a call.
    """
    return [parse_call_body(body) for body in TOOL_CALL_BLOCK.findall(text)]


def parse_call_body(body: str) -> ParsedCall:
    """One block's JSON; every way it can be wrong becomes a :class:`ToolCallError`."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCallError(f"Failed to decode tool call: invalid JSON ({exc})")
    if not isinstance(call, dict):
        return ToolCallError(
            'Failed to decode tool call: expected {"name": ..., "arguments": {...}}'
        )
    name = call.get("name")
    if name != TOOL_NAME:
        return ToolCallError(
            f"Failed to decode tool call: unknown tool {name!r}; use {TOOL_NAME!r}"
        )
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ToolCallError(f"Failed to decode tool call: arguments are not JSON ({exc})")
    if not isinstance(arguments, dict):
        return ToolCallError("Failed to decode tool call: 'arguments' must be a JSON object")
    return _call_from_arguments(arguments)


def _call_from_arguments(arguments: dict[str, object]) -> ParsedCall:
    missing = [key for key in ("code", "input") if key not in arguments]
    if missing:
        return ToolCallError(f"Failed to decode tool call: missing argument(s) {missing}")
    unexpected = sorted(set(arguments) - {"code", "input"})
    if unexpected:
        return ToolCallError(f"Failed to decode tool call: unexpected argument(s) {unexpected}")
    code, stdin = arguments["code"], arguments["input"]
    if not isinstance(code, str) or not isinstance(stdin, str):
        return ToolCallError("Failed to decode tool call: 'code' and 'input' must be strings")
    if not code.strip():
        return ToolCallError("Failed to decode tool call: 'code' is empty")
    return ToolCall(code=code, stdin=stdin)


def is_tool_error(result: ExecuteResult) -> bool:
    """An errored call: the run did not end ``ok``, or it printed a Python error."""
    if result.status != Status.ok:
        return True
    return bool(OUTPUT_ERROR.search(result.stderr) or OUTPUT_ERROR.search(result.stdout))


def render_result(result: ExecuteResult) -> str:
    """What the model reads of one execution (the release's wording, without the timing).

    The execution time is left out: it differs between identical runs, and the model would be
    conditioned on noise.
    """
    if result.status == Status.ok:
        parts = ["Tool call success"]
    else:
        reason = (
            f"{result.status.value}: {result.message}" if result.message else result.status.value
        )
        parts = ["Tool call failure", f"reason: {reason}"]
    if result.stdout:
        parts.append(f"stdout: {result.stdout}")
    if result.stderr:
        parts.append(f"stderr: {result.stderr}")
    return "\n".join(parts)


def truncate(text: str, max_chars: int, side: TruncateSide = "middle") -> str:
    """Cut ``text`` to about ``max_chars``, saying so (the release's three ways).

    ``left`` keeps the beginning, ``right`` keeps the end, ``middle`` keeps both ends.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


def response_block(text: str) -> str:
    """One ``<tool_response>`` block; the chat module wraps blocks into a user turn."""
    return f"{RESPONSE_OPEN}\n{text}\n{RESPONSE_CLOSE}"


@dataclass(frozen=True)
class AnswerTags:
    """The ``<answer>`` blocks a text closes, and whether its tags pair up."""

    closed: int
    balanced: bool


def answer_tags(text: str) -> AnswerTags:
    closed = len(ANSWER_BLOCK.findall(text))
    balanced = text.count(ANSWER_OPEN) == closed == text.count(ANSWER_CLOSE)
    return AnswerTags(closed=closed, balanced=balanced)


def extract_answer(text: str) -> str | None:
    """The content of the last closed ``<answer>`` block, or None."""
    blocks = ANSWER_BLOCK.findall(text)
    return blocks[-1].strip() if blocks else None
