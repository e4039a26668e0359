"""rollout.py: the multi-turn loop with scripted policies and real (unsandboxed) executions."""

from __future__ import annotations

import asyncio

import pytest
from transformers import PreTrainedTokenizerFast

from sandbox_service.models import ExecuteRequest, ExecuteResult
from trainer.backends.scripted import Script, ScriptedBackend
from trainer.chat import EOS, prompt_text, tool_turn_text
from trainer.reward import reward
from trainer.roc import p_err, p_format, release_p_err, release_p_format
from trainer.rollout import Rollout, RolloutSettings, generate_rollouts
from trainer.tool_runners import SubprocessRunner
from trainer.tools import format_tool_call, user_prompt
from trainer.toy_task import scripted_solver, toy_problems

SETTINGS = RolloutSettings(max_turns=4, max_response_tokens=400)


class CountingRunner(SubprocessRunner):
    """Real executions, and a record of how they were batched."""

    def __init__(self) -> None:
        super().__init__(concurrency=4)
        self.batches: list[int] = []

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        self.batches.append(len(calls))
        return await super().run(calls)


def roll(
    tokenizer: PreTrainedTokenizerFast,
    script: Script,
    problems: list[str],
    settings: RolloutSettings = SETTINGS,
) -> tuple[list[Rollout], CountingRunner, ScriptedBackend]:
    prompts = [
        tokenizer.encode(prompt_text(user_prompt(p)), add_special_tokens=False) for p in problems
    ]
    backend, runner = ScriptedBackend(tokenizer, script), CountingRunner()
    rollouts = asyncio.run(generate_rollouts(prompts, backend, tokenizer, runner, settings))
    return rollouts, runner, backend


def test_scripted_solver_rollouts_execute_the_tool_and_earn_reward(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    problems = toy_problems(6, seed=3)
    rollouts, runner, backend = roll(tokenizer, scripted_solver, [p.problem for p in problems])
    assert runner.executed == 6
    assert runner.batches == [6]  # every call of the round in one batch
    assert backend.calls == [6, 6]  # two rounds, nobody left behind
    for rollout, problem in zip(rollouts, problems, strict=True):
        assert (rollout.turns, rollout.tool_calls, rollout.tool_errors) == (2, 1, 0)
        assert rollout.finish == "eos" and not rollout.truncated
        assert f"stdout: {problem.answer}" in tokenizer.decode(rollout.response_ids)
        assert (
            reward(rollout.model_text, problem.answer, truncated=False, require_answer_tag=True)
            == 1.0
        )
        sample = rollout.roc_sample(1.0)
        assert (p_err(sample), p_format(sample)) == (0.0, 0.0)


def test_masks_cover_exactly_the_model_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    [problem] = toy_problems(1, seed=4)
    [rollout], _, _ = roll(tokenizer, scripted_solver, [problem.problem])
    ids, mask = rollout.response_ids, rollout.loss_mask
    assert len(ids) == len(mask) == len(rollout.logprobs)
    # Three runs: model turn 1, the tool turn, model turn 2.
    runs = [(mask[0], 1)]
    for m in mask[1:]:
        runs = [*runs[:-1], (m, runs[-1][1] + 1)] if m == runs[-1][0] else [*runs, (m, 1)]
    assert [m for m, _ in runs] == [1, 0, 1]
    first, tool, _ = (n for _, n in runs)
    call = format_tool_call(f"print({problem.problem[8:-1]})")
    assert tokenizer.decode(ids[:first], skip_special_tokens=False) == call
    tool_text = tokenizer.decode(ids[first : first + tool], skip_special_tokens=False)
    assert tool_text == tool_turn_text([f"Tool call success\nstdout: {problem.answer}\n"])
    answer = tokenizer.decode(ids[first + tool :], skip_special_tokens=False)
    assert answer == f"<answer>\\boxed{{{problem.answer}}}</answer>{EOS}"
    assert ids[-1] == tokenizer.eos_token_id
    # The transcript is the concatenation of what was generated and shown: never re-tokenised.
    assert rollout.model_text == call + answer


def script_of(*turns: str) -> Script:
    return lambda transcript, turn: turns[min(turn, len(turns) - 1)]


def test_tool_errors_are_counted_and_shown_to_the_model(tokenizer: PreTrainedTokenizerFast) -> None:
    script = script_of(
        format_tool_call("print(1/0)"),
        '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": 1</tool_call>',
        format_tool_call("import sys; print(sys.stdin.read()[::-1])", "olleh"),
        f"<answer>\\boxed{{1}}</answer>{EOS}",
    )
    [rollout], runner, _ = roll(
        tokenizer, script, ["q"], RolloutSettings(max_turns=5, max_response_tokens=2000)
    )
    assert (rollout.turns, rollout.tool_calls, rollout.tool_errors) == (4, 3, 2)
    assert runner.executed == 2  # the malformed call never reached the runner
    transcript = tokenizer.decode(rollout.response_ids, skip_special_tokens=False)
    assert "ZeroDivisionError" in transcript
    assert "Failed to decode tool call: invalid JSON" in transcript
    assert "stdout: hello" in transcript
    assert p_err(rollout.roc_sample(1.0)) == pytest.approx(2 / 3)


def test_repeated_answers_raise_p_format(tokenizer: PreTrainedTokenizerFast) -> None:
    script = script_of(
        "<answer>\\boxed{1}</answer>" + format_tool_call("print(2)"),
        f"<answer>\\boxed{{2}}</answer> or <answer>\\boxed{{3}}</answer>{EOS}",
    )
    [rollout], _, _ = roll(tokenizer, script, ["q"])
    sample = rollout.roc_sample(1.0)
    assert (sample.answers, sample.turns) == (3, 2)
    assert p_format(sample) == 1.0  # min(1, (3 - 1) / 2)
    [plain], _, _ = roll(tokenizer, script_of(f"no tags, \\boxed{{1}}{EOS}"), ["q"])
    assert p_format(plain.roc_sample(1.0)) == 1.0 and p_err(plain.roc_sample(1.0)) == 0.5


def test_response_text_is_the_decoded_response_and_scores_as_the_release_scores_it(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    # The two cases, on the real loop: a correct one-turn answer without the tool has
    # release p_format 1 (its turn's opening is in the prompt: no complete turn in the
    # response), ours 0; a malformed call's response has no "error" in it: release p_err 0,
    # ours 1.
    [direct], _, _ = roll(tokenizer, script_of(f"<answer>\\boxed{{1}}</answer>{EOS}"), ["q"])
    [malformed], _, _ = roll(
        tokenizer,
        script_of(
            '<tool_call>{"name": "python_code_with_standard_io"}</tool_call>',
            f"<answer>\\boxed{{1}}</answer>{EOS}",
        ),
        ["q"],
    )
    for rollout in (direct, malformed):
        text = rollout.response_text
        assert text == tokenizer.decode(rollout.response_ids, skip_special_tokens=False)
    one_turn = direct.roc_sample(1.0)
    assert (release_p_err(one_turn.response_text), release_p_format(one_turn.response_text)) == (
        0.5,
        1.0,
    )
    assert (p_err(one_turn), p_format(one_turn)) == (0.5, 0.0)
    bad_call = malformed.roc_sample(1.0)
    assert "Failed to decode tool call" in bad_call.response_text
    assert release_p_err(bad_call.response_text) == 0.0 and p_err(bad_call) == 1.0
    # Two turns: one complete turn in the response, one answer: (1 - 1) / 1.
    assert release_p_format(bad_call.response_text) == 0.0


def test_max_turns_truncates_a_rollout_that_keeps_calling(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    # Every turn boxes the right answer, then calls the tool again: never finishes.
    script = script_of("<answer>\\boxed{0}</answer>" + format_tool_call("print(0)"))
    [rollout], runner, _ = roll(tokenizer, script, ["q"])
    assert rollout.finish == "max_turns" and rollout.truncated
    assert rollout.turns == SETTINGS.max_turns
    assert rollout.tool_calls == runner.executed == SETTINGS.max_turns - 1  # the last is not run
    # The rollout's own text is right; being cut off is what makes it worth nothing.
    text = rollout.model_text
    assert reward(text, "0", truncated=False, require_answer_tag=True) == 1.0
    assert reward(text, "0", truncated=rollout.truncated, require_answer_tag=True) == 0.0


def test_reward_reads_the_models_text_not_the_tools_output(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    # The program prints a right box that the model's own text never spells out.
    code = "print(chr(92) + 'boxed{' + str(6 * 7) + '}')"
    [rollout], _, _ = roll(tokenizer, script_of(format_tool_call(code), f"done{EOS}"), ["q"])
    transcript = tokenizer.decode(rollout.response_ids, skip_special_tokens=False)
    assert isinstance(transcript, str)
    assert "stdout: \\boxed{42}" in transcript and not rollout.truncated
    assert reward(transcript, "42", truncated=False, require_answer_tag=False) == 1.0
    assert reward(rollout.model_text, "42", truncated=False, require_answer_tag=False) == 0.0


def test_max_length_truncates_generation_and_tool_turns(tokenizer: PreTrainedTokenizerFast) -> None:
    settings = RolloutSettings(max_turns=4, max_response_tokens=60)
    [rambling], _, _ = roll(tokenizer, script_of("la " * 200), ["q"], settings)
    assert rambling.finish == "length" and len(rambling.response_ids) == 60
    assert all(m == 1 for m in rambling.loss_mask)
    # A tool response that does not fit ends the rollout instead of overflowing the budget.
    flood = format_tool_call("print('x' * 5000)")
    [flooded], runner, _ = roll(tokenizer, script_of(flood), ["q"], settings)
    assert runner.executed == 1
    assert flooded.finish == "length" and len(flooded.response_ids) <= 60
    assert all(m == 1 for m in flooded.loss_mask)


def test_long_tool_output_is_truncated_in_the_middle(tokenizer: PreTrainedTokenizerFast) -> None:
    settings = RolloutSettings(max_turns=2, max_response_tokens=3000, max_tool_response_chars=40)
    script = script_of(format_tool_call("print('a' * 500 + 'b' * 500)"), f"done{EOS}")
    [rollout], _, _ = roll(tokenizer, script, ["q"], settings)
    transcript = tokenizer.decode(rollout.response_ids, skip_special_tokens=False)
    # 20 characters of each end: the header's start, and the tail of the b's with the newline.
    kept = "Tool call success\nst...(truncated)..." + "b" * 19 + "\n"
    assert f"<tool_response>\n{kept}\n</tool_response>" in transcript
    assert "a" * 30 not in transcript


def test_finished_rollouts_wait_while_others_call_tools(tokenizer: PreTrainedTokenizerFast) -> None:
    def script(transcript: str, turn: int) -> str:
        quick = "quick" in transcript
        if quick or turn == 2:
            return f"<answer>\\boxed{{7}}</answer>{EOS}"
        return format_tool_call(f"print({turn})")

    rollouts, runner, backend = roll(tokenizer, script, ["quick one", "slow one", "slow two"])
    assert backend.calls == [3, 2, 2]
    assert runner.batches == [2, 2]
    assert [r.turns for r in rollouts] == [1, 3, 3]
