"""The toy task of CPU runs: arithmetic that needs the tool, with its SFT transcripts.

Problems like "What is 47 * 86 + 3?" have integer answers a tiny model cannot compute but can
get by calling the tool and copying the printed number into ``<answer>\\boxed{}</answer>``.
Half the SFT transcripts do that; the other half answer at once, as a model that can do the
arithmetic in its head would. The fine-tuned tiny model therefore calls the tool about half
the time and is nearly always wrong when it does not: RL has to discover that the tool pays,
the behaviour the rStar2-Agent recipe is about, and the reward rises as it does.

Everything is generated from a seed; ``trainer/data/toy_arith.jsonl`` is this module's output
(``python -m trainer.toy_task``).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from sandbox_service.models import ExecuteResult, Status
from trainer.chat import EOS, conversation_segments
from trainer.problems import Problem, write_problems
from trainer.tools import format_tool_call, render_result, user_prompt

SHIPPED = Path(__file__).parent / "data" / "toy_arith.jsonl"
SHIPPED_SEED, SHIPPED_COUNT = 1234, 512
FORMS = ("{a} * {b} + {c}", "{a} * {b} - {c}", "{a} + {b} * {c}")


def toy_problems(count: int, seed: int) -> list[Problem]:
    """``count`` problems; the expression is also its own Python program."""
    rng = random.Random(seed)
    problems = []
    for i in range(count):
        form = FORMS[i % len(FORMS)]
        expression = form.format(a=rng.randint(10, 99), b=rng.randint(10, 99), c=rng.randint(2, 9))
        problems.append(Problem(f"What is {expression}?", str(_evaluate(expression)), f"toy-{i}"))
    return problems


HELDOUT_SEED, HELDOUT_COUNT = 4321, 64


def heldout_problems(count: int = HELDOUT_COUNT) -> list[Problem]:
    """Toy problems for evaluation while training: generated from another seed, none of them
    in the shipped training set."""
    train = {p.problem for p in toy_problems(SHIPPED_COUNT, SHIPPED_SEED)}
    fresh = [p for p in toy_problems(count * 2, HELDOUT_SEED) if p.problem not in train]
    return [Problem(p.problem, p.answer, f"toy-heldout-{i}") for i, p in enumerate(fresh[:count])]


def _evaluate(expression: str) -> int:
    """The value of one of our own FORMS (never model text): ``a op b op c`` with * before +/-."""
    a, op1, b, op2, c = expression.split()
    if op1 == "*":
        head = int(a) * int(b)
        return head + int(c) if op2 == "+" else head - int(c)
    return int(a) + int(b) * int(c)


def expression_of(problem: Problem) -> str:
    return problem.problem.removeprefix("What is ").removesuffix("?")


def toy_transcript(problem: Problem, use_tool: bool = True) -> list[dict[str, str]]:
    """A correct solution: one tool call, then the printed value as the answer; or, without
    the tool, the answer straight away (right, but a tiny model cannot do the arithmetic)."""
    if not use_tool:
        return [
            {"role": "user", "content": user_prompt(problem.problem)},
            {"role": "assistant", "content": f"<answer>\\boxed{{{problem.answer}}}</answer>"},
        ]
    code = f"print({expression_of(problem)})"
    printed = ExecuteResult(status=Status.ok, exit_code=0, stdout=f"{problem.answer}\n")
    return [
        {"role": "user", "content": user_prompt(problem.problem)},
        {"role": "assistant", "content": format_tool_call(code, "")},
        {"role": "tool", "content": render_result(printed)},
        {"role": "assistant", "content": f"<answer>\\boxed{{{problem.answer}}}</answer>"},
    ]


def scripted_solver(transcript: str, turn: int) -> str:
    """The toy task done right, as a script for ``ScriptedBackend``: run the expression of the
    last problem, then box the number the program printed (so it is right only if the tool
    really ran)."""
    if turn == 0:
        expression = re.findall(r"What is (.*?)\?", transcript)[-1]
        return format_tool_call(f"print({expression})")
    printed = re.findall(r"stdout: (-?\d+)", transcript)[-1]
    return f"<answer>\\boxed{{{printed}}}</answer>{EOS}"


def toy_conversations(
    count: int, seed: int, direct_share: float = 0.5
) -> list[list[dict[str, str]]]:
    """SFT transcripts: a ``direct_share`` of them answer without the tool."""
    rng = random.Random(seed)
    return [
        toy_transcript(p, use_tool=rng.random() >= direct_share) for p in toy_problems(count, seed)
    ]


def tokenizer_corpus(count: int = 256, seed: int = 0) -> list[str]:
    """Rendered transcripts: the text a tiny tokenizer for this task is trained on."""
    return [
        "".join(s.text for s in conversation_segments(toy_transcript(p)))
        for p in toy_problems(count, seed)
    ]


def main() -> None:
    write_problems(SHIPPED, toy_problems(SHIPPED_COUNT, SHIPPED_SEED))
    print(f"wrote {SHIPPED_COUNT} problems to {SHIPPED}")


if __name__ == "__main__":
    main()
