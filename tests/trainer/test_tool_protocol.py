"""tools.py and chat.py: parsing calls the model writes, and the text the model reads back."""

from __future__ import annotations

import json
import re

import pytest

from sandbox_service.models import ExecuteResult, Mode, Status
from trainer.chat import conversation_segments, prompt_text, tool_turn_text
from trainer.tools import (
    TOOL_NAME,
    TOOL_SCHEMA,
    ToolCall,
    ToolCallError,
    answer_tags,
    extract_answer,
    format_tool_call,
    is_tool_error,
    parse_tool_calls,
    render_result,
    system_prompt,
    truncate,
)

N = '{"name": "python_code_with_standard_io", "arguments": '


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def test_well_formed_call_parses() -> None:
    text = "let me compute " + call(
        json.dumps({"name": TOOL_NAME, "arguments": {"code": "print(input())", "input": "7\n"}})
    )
    assert parse_tool_calls(text) == [ToolCall(code="print(input())", stdin="7\n")]


def test_format_tool_call_round_trips_awkward_code() -> None:
    code = 's = "</tool_call> \\" {}"\nprint(s)'
    assert parse_tool_calls(format_tool_call(code, "x")) == [ToolCall(code, "x")]


def test_arguments_given_as_a_json_string_are_accepted() -> None:
    inner = json.dumps({"code": "print(1)", "input": ""})
    text = call(json.dumps({"name": TOOL_NAME, "arguments": inner}))
    assert parse_tool_calls(text) == [ToolCall("print(1)", "")]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            N + '{"code": "print(1)"',
            "invalid JSON",
        ),
        ("print(1)", "invalid JSON"),
        ('["python_code_with_standard_io"]', "expected"),
        ('{"name": "bash", "arguments": {"code": "ls", "input": ""}}', "unknown tool 'bash'"),
        ('{"arguments": {"code": "1", "input": ""}}', "unknown tool None"),
        ('{"name": "python_code_with_standard_io"}', "'arguments' must be a JSON object"),
        (N + '"{bad"}', "arguments are not JSON"),
        (N + '{"input": ""}}', "['code']"),
        (N + '{"code": "1"}}', "['input']"),
        (
            N + '{"code": "1", "input": "", "x": 1}}',
            "unexpected argument(s) ['x']",
        ),
        (
            N + '{"code": 5, "input": ""}}',
            "strings",
        ),
        (
            N + '{"code": "  ", "input": ""}}',
            "empty",
        ),
    ],
)
def test_malformed_calls_become_errors_the_model_reads(body: str, says: str) -> None:
    [parsed] = parse_tool_calls(call(body))
    assert isinstance(parsed, ToolCallError)
    assert parsed.message.startswith("Failed to decode tool call")
    assert says in parsed.message


def test_unclosed_call_is_not_a_call_and_several_calls_keep_their_order() -> None:
    assert parse_tool_calls("<tool_call>" + json.dumps({"name": TOOL_NAME})) == []
    text = format_tool_call("print(1)") + " and " + call("oops") + format_tool_call("print(2)")
    parsed = parse_tool_calls(text)
    assert [type(p) for p in parsed] == [ToolCall, ToolCallError, ToolCall]
    assert parsed[2] == ToolCall("print(2)", "")


def test_system_prompt_carries_the_schema_in_tools_tags() -> None:
    match = re.search(r"<tools>\n(.*)\n</tools>", system_prompt(), re.DOTALL)
    assert match is not None
    assert json.loads(match.group(1)) == TOOL_SCHEMA


def result(status: Status, stdout: str = "", stderr: str = "", message: str = "") -> ExecuteResult:
    return ExecuteResult(status=status, stdout=stdout, stderr=stderr, message=message)


def test_render_result_success_and_failure() -> None:
    assert render_result(result(Status.ok, "42\n")) == "Tool call success\nstdout: 42\n"
    failed = render_result(result(Status.timeout, stderr="", message="ran past 10 s"))
    assert failed == "Tool call failure\nreason: timeout: ran past 10 s"
    crashed = render_result(result(Status.error, "partial\n", "Traceback ...\nZeroDivisionError"))
    assert crashed.splitlines()[:3] == ["Tool call failure", "reason: error", "stdout: partial"]


@pytest.mark.parametrize(
    ("res", "errored"),
    [
        (result(Status.ok, "42\n"), False),
        (result(Status.ok, "the error bars are small\n"), False),
        (result(Status.ok, "", "Traceback (most recent call last):\n  ...\nValueError: x"), True),
        (result(Status.ok, "ValueError: caught and printed\n"), True),
        (result(Status.timeout), True),
        (result(Status.error, "", "NameError: name 'x' is not defined"), True),
        (result(Status.internal_error), True),
    ],
)
def test_tool_error_detection(res: ExecuteResult, errored: bool) -> None:
    assert is_tool_error(res) is errored


def test_truncation_sides() -> None:
    text = "".join(str(i % 10) for i in range(100))
    assert truncate(text, 200) == text
    assert truncate(text, 10, "left") == text[:10] + "...(truncated)"
    assert truncate(text, 10, "right") == "(truncated)..." + text[-10:]
    assert truncate(text, 10, "middle") == text[:5] + "...(truncated)..." + text[-5:]


def test_answer_tags_and_extraction() -> None:
    assert answer_tags("no answer") == answer_tags("") and answer_tags("").closed == 0
    two = "<answer>\\boxed{1}</answer> wait <answer>\\boxed{2}</answer>"
    assert answer_tags(two).closed == 2 and answer_tags(two).balanced
    assert extract_answer(two) == "\\boxed{2}"
    stray = "<answer>\\boxed{1}</answer> <answer> cut off"
    assert answer_tags(stray).closed == 1 and not answer_tags(stray).balanced


def test_tool_turn_closes_the_assistant_turn_and_opens_the_next() -> None:
    text = tool_turn_text(["first", "second"])
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nfirst\n</tool_response>\n"
        "<tool_response>\nsecond\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_conversation_segments_mask_everything_but_the_assistant() -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": format_tool_call("print(1)")},
        {"role": "tool", "content": "Tool call success\nstdout: 1\n"},
        {"role": "assistant", "content": "<answer>\\boxed{1}</answer>"},
    ]
    segments = conversation_segments(messages)
    assert [s.trainable for s in segments] == [False, True, False, True, True]
    assert segments[0].text == prompt_text("U", "S")
    assert segments[2].text == tool_turn_text(["Tool call success\nstdout: 1\n"])
    assert segments[-1].text == "<|im_end|>"


def test_chat_template_renders_what_the_segments_render() -> None:
    from trainer.tiny_model import build_tokenizer

    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": format_tool_call("print(1)")},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
        {"role": "assistant", "content": "<answer>\\boxed{1}</answer>"},
    ]
    joined = "".join(s.text for s in conversation_segments(messages))
    tokenizer = build_tokenizer([joined], vocab_size=300)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == joined + "\n"
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == prompt_text("U", "S")


def test_calls_become_repl_requests_with_the_configured_limits() -> None:
    request = ToolCall("x = 6 * 7\nx", "in").request(timeout_s=3.0, memory_mb=256)
    assert (request.code, request.stdin, request.timeout_s, request.memory_mb) == (
        "x = 6 * 7\nx",
        "in",
        3.0,
        256,
    )
    assert request.mode == Mode.repl
    assert ToolCall("print(1)").request(3.0, 256, Mode.script).mode == Mode.script
