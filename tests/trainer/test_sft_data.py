"""sft_data.py and the SFT command: the common chat and function-calling formats, rendered with
the tools they offer, trained on the assistant's words and calls only, for the epochs asked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from transformers import PreTrainedTokenizerFast

from trainer.chat import EOS
from trainer.sft import encode_conversation, main
from trainer.sft_data import load_sft_rows, to_messages
from trainer.tools import SYSTEM_PROMPT

from .test_sft import tiny_policy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
OPENAI = {
    "tools": [WEATHER],
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "4C, rain"},
        {"role": "assistant", "content": [{"type": "text", "text": "Paris is warmer."}]},
    ],
}
SHAREGPT = {  # glaive-function-calling as LLaMA-Factory converts it
    "system": "You may call functions.",
    "tools": json.dumps([WEATHER["function"]]),
    "conversations": [
        {"from": "human", "value": "Is it raining in Oslo?"},
        {
            "from": "function_call",
            "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        },
        {"from": "observation", "value": '{"weather": "rain"}'},
        {"from": "gpt", "value": "Yes, it is raining."},
        {"from": "human", "value": "Thanks!"},
    ],
}
XLAM = {
    "query": "Weather in Rome?",
    "tools": json.dumps([{"name": "get_weather", "description": "d", "parameters": {}}]),
    "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Rome"}}]),
}
CHAT = {
    "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
}


def trained_and_shown(tokenizer: PreTrainedTokenizerFast, messages: list) -> tuple[str, str]:
    sample = encode_conversation(tiny_policy(tokenizer), messages)
    pairs = list(zip(sample.token_ids, sample.loss_mask, strict=True))
    trained = tokenizer.decode([t for t, m in pairs if m], skip_special_tokens=False)
    shown = tokenizer.decode([t for t, m in pairs if not m], skip_special_tokens=False)
    assert isinstance(trained, str) and isinstance(shown, str)
    return trained, shown


def test_openai_messages_with_parallel_tool_calls(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = to_messages(OPENAI)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[2]["tool_calls"] == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
    ]
    system = messages[0]["content"]
    assert system.startswith("You are a helpful assistant.\n\n# Tools")
    offered = re.search(r"<tools>\n(.*)\n</tools>", system, re.DOTALL)
    assert offered is not None and json.loads(offered.group(1)) == WEATHER
    trained, shown = trained_and_shown(tokenizer, messages)
    calls = re.findall(r"<tool_call>(.*?)</tool_call>", trained)
    assert [json.loads(c)["arguments"]["city"] for c in calls] == ["Paris", "Oslo"]
    assert trained.endswith("</tool_call>Paris is warmer." + EOS)
    assert "18C, sunny" in shown and "4C, rain" in shown and "18C" not in trained
    assert "get_weather" in shown  # the tool offered in the system prompt


def test_legacy_openai_functions_and_function_call() -> None:
    legacy = {
        "functions": [WEATHER["function"]],
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {"role": "function", "name": "get_weather", "content": "4C"},
            {"role": "assistant", "content": "Cold."},
        ],
    }
    messages = to_messages(legacy)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER) in messages[0]["content"]  # the bare function schema, wrapped


def test_sharegpt_function_call_and_observation(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = to_messages(SHAREGPT)
    # The trailing human turn has no answer to learn: dropped.
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert messages[0]["content"].startswith("You may call functions.\n\n# Tools")
    assert '"type": "function"' in messages[0]["content"]  # a bare function schema, wrapped
    trained, shown = trained_and_shown(tokenizer, messages)
    assert '{"weather": "rain"}' in shown and "rain" not in trained.split("</tool_call>")[0]
    assert trained.endswith("Yes, it is raining." + EOS)


def test_xlam_calls_without_results_end_at_the_call(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = to_messages(XLAM)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    trained, _ = trained_and_shown(tokenizer, messages)
    # What a rollout would generate: the call, up to the stop string; the end is not trained.
    assert trained.endswith("</tool_call>") and json.loads(trained[11:-12])["name"] == "get_weather"


def test_plain_chat_gets_the_rl_system_prompt_and_a_row_without_answer_is_dropped(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = tmp_path / "mixed.jsonl"
    unanswered = {"conversations": [{"from": "human", "value": "hello?"}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in (CHAT, unanswered, XLAM)))
    conversations = load_sft_rows(path)
    assert len(conversations) == 2 and conversations[0] == CHAT["messages"]
    trained, shown = trained_and_shown(tokenizer, conversations[0])
    assert trained == "Hi!" + EOS and shown.startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
    with pytest.raises(ValueError, match="row 0: unknown SFT row shape"):
        (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
        load_sft_rows(tmp_path / "bad.jsonl")


def test_sft_command_trains_epochs_on_a_file_and_saves_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (OPENAI, SHAREGPT, XLAM, CHAT) * 2))
    config = tmp_path / "sft.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "path": "tiny",
                    "device": "cpu",
                    "precision": "float32",
                    "tiny": {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64},
                },
                "sft": {
                    "data": str(data),
                    "epochs": 3,
                    "batch_size": 3,
                    "lr": 1e-2,
                    "warmup_steps": 1,
                },
            }
        )
    )
    main(["--config", str(config), "--output", str(tmp_path / "model")])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 * 3  # 8 conversations in batches of 3, three times
    assert summary["last_loss"] < 0.8 * summary["first_loss"]
    assert (tmp_path / "model" / "model.safetensors").exists()
