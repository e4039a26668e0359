"""prompt.style and reward.require_answer_tag: the release's prompt to the character (checked
against its own chat template), threaded through rollouts, SFT and the reward."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _compile_jinja_template

from trainer.backends.scripted import Script, ScriptedBackend
from trainer.chat import (
    EOS,
    IM_END,
    assistant_text,
    conversation_segments,
    decode,
    prompt_text,
    tool_turn_text,
)
from trainer.config import RewardConfig, load_config
from trainer.modeling import Policy
from trainer.problems import Problem
from trainer.rollout import RolloutSettings
from trainer.step import Scored, sample_and_score
from trainer.tool_runners import SubprocessRunner
from trainer.tools import (
    RELEASE_TOOL_SCHEMA,
    TOOL_NAME,
    TOOL_SCHEMA,
    format_tool_call,
    system_prompt,
    user_prompt,
)
from trainer.toy_task import scripted_solver, toy_problems, toy_transcript

from .test_sft import tiny_policy

RELEASE_TEMPLATE = Path(__file__).parent / "data" / "rstar2_agent_chat_template.jinja"
CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def release_template(**kwargs: object) -> str:
    template = _compile_jinja_template(RELEASE_TEMPLATE.read_text())
    return str(template.render(**kwargs))


def score(
    policy: Policy,
    problems: list[Problem],
    script: Script,
    settings: RolloutSettings,
    require_answer_tag: bool,
) -> list[list[Scored]]:
    """One scored rollout per problem, the real rollout loop and reward, a scripted policy."""
    backend = ScriptedBackend(policy.tokenizer, script)
    return asyncio.run(
        sample_and_score(
            problems,
            1,
            policy,
            backend,
            SubprocessRunner(),
            settings,
            RewardConfig(require_answer_tag=require_answer_tag),
        )
    )


def test_release_prompt_is_the_release_chat_template() -> None:
    problem = "What is 2 + 3?"
    rendered = release_template(
        messages=[{"role": "user", "content": problem}],
        tools=[RELEASE_TOOL_SCHEMA],
        add_generation_prompt=True,
    )
    assert prompt_text(user_prompt(problem), style="release") == rendered
    assert rendered.endswith("<|im_start|>assistant\n<reason>")


def test_release_tool_turn_is_what_the_release_appends_after_the_model_turn() -> None:
    # The release renders the tool messages alone and drops the default system turn; what is
    # left follows the model's <|im_end|> directly.
    system = release_template(messages=[{}], add_generation_prompt=False)
    tools = [{"role": "tool", "content": "one"}, {"role": "tool", "content": "two"}]
    rendered = release_template(messages=tools, add_generation_prompt=True)
    assert rendered.startswith(system)
    assert tool_turn_text(["one", "two"], "release") == IM_END + rendered[len(system) :]


def test_release_style_writes_calls_as_the_release_template_does() -> None:
    call = {"name": TOOL_NAME, "arguments": {"code": "print(1)", "input": ""}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me run it.", "tool_calls": [call, call]},
    ]
    rendered = release_template(messages=messages, tools=[RELEASE_TOOL_SCHEMA])
    turn = "<|im_start|>assistant\n" + assistant_text(messages[1], "release") + IM_END
    assert turn in rendered
    assert assistant_text(messages[1]) == "Let me run it." + format_tool_call("print(1)") * 2


def test_plain_style_keeps_our_tool_description_and_bare_turns() -> None:
    assert prompt_text("U").endswith("<|im_start|>assistant\n")
    assert "<reason>" not in tool_turn_text(["x"])
    for style, schema in (("plain", TOOL_SCHEMA), ("release", RELEASE_TOOL_SCHEMA)):
        match = re.search(r"<tools>\n(.*)\n</tools>", system_prompt(style), re.DOTALL)  # type: ignore[arg-type]
        assert match is not None and json.loads(match.group(1)) == schema
    assert TOOL_SCHEMA != RELEASE_TOOL_SCHEMA


def test_release_style_rollout_opens_every_turn_with_reason(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    policy = tiny_policy(tokenizer)
    problems = toy_problems(2, seed=8)
    seen: list[str] = []

    def script(transcript: str, turn: int) -> str:
        seen.append(transcript)
        return scripted_solver(transcript, turn)

    settings = RolloutSettings(max_turns=3, max_response_tokens=300, prompt_style="release")
    groups = score(policy, problems, script, settings, require_answer_tag=True)
    assert all(t.endswith("<|im_start|>assistant\n<reason>") for t in seen) and len(seen) == 4
    for [scored], problem in zip(groups, problems, strict=True):
        r = scored.rollout
        assert scored.reward == 1.0 and r.tool_calls == 1
        assert decode(tokenizer, r.prompt_ids) == prompt_text(
            user_prompt(problem.problem), style="release"
        )
        masked = [t for t, m in zip(r.response_ids, r.loss_mask, strict=True) if not m]
        assert decode(tokenizer, masked).endswith("<|im_start|>assistant\n<reason>")
        assert "<reason>" not in r.model_text  # the prefill is the prompt's, not the model's


def test_release_style_sft_transcripts_are_what_the_rollout_shows() -> None:
    [problem] = toy_problems(1, seed=9)
    segments = conversation_segments(toy_transcript(problem), style="release")
    assert segments[0].text == prompt_text(user_prompt(problem.problem), style="release")
    assert segments[2].text.startswith(IM_END + "<|im_start|>user")
    assert segments[2].text.endswith("<reason>") and not segments[2].trainable


@pytest.mark.parametrize("require", [False, True])
def test_reward_requires_the_answer_tag_when_configured(
    tokenizer: PreTrainedTokenizerFast, require: bool
) -> None:
    policy: Policy = tiny_policy(tokenizer)
    problems = toy_problems(1, seed=10)
    answer = problems[0].answer

    def script(transcript: str, turn: int) -> str:
        return f"so \\boxed{{{answer}}}{EOS}"  # right, but outside <answer>

    settings = RolloutSettings(max_turns=2, max_response_tokens=100)
    [[scored]] = score(policy, problems, script, settings, require_answer_tag=require)
    assert scored.reward == (0.0 if require else 1.0)


def test_the_recipe_uses_the_release_prompt_and_the_reports_answer_rule() -> None:
    config = load_config(CONFIGS / "rstar2_agent_14b.yaml")
    assert config.prompt.style == "release"
    assert config.reward.require_answer_tag
    tiny = load_config(CONFIGS / "tiny_cpu.yaml")
    assert tiny.prompt.style == "plain"


def test_truncated_rollouts_score_zero_unless_zero_truncated_is_off(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    # A right answer in a turn that still calls the tool at the turn limit: the report's rule
    # scores 0; the release's scores the text.
    [problem] = toy_problems(1, seed=9)
    policy = tiny_policy(tokenizer)
    text = f"<answer>\\boxed{{{problem.answer}}}</answer>" + format_tool_call("print(1)")
    settings = RolloutSettings(max_turns=1, max_response_tokens=400)
    backend = ScriptedBackend(policy.tokenizer, lambda transcript, turn: text)
    for zero, expected in ((True, 0.0), (False, 1.0)):
        [[scored]] = asyncio.run(
            sample_and_score(
                [problem],
                1,
                policy,
                backend,
                SubprocessRunner(),
                settings,
                RewardConfig(zero_truncated=zero),
            )
        )
        assert scored.rollout.finish == "max_turns" and scored.reward == expected
