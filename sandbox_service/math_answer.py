"""Math-answer verification: the last ``\\boxed{}`` of a response against a reference answer.

One pure function, :func:`verify`, shared by the trainer's reward and the service's
``/v1/verify`` endpoint, so that a rollout is scored the same way wherever it is scored. It
imports no service code (no FastAPI, no settings); only the math-verify library, which parses
LaTeX into sympy and compares values (``\\frac{1}{2}`` equals ``0.5``, ``2\\sqrt{2}`` equals
``\\sqrt{8}``, ``\\{1,2\\}`` equals ``\\{2,1\\}``).

What it does not do: run the model's code, or protect against a pathological expression that
makes sympy slow. math-verify bounds its own work with ``SIGALRM``, which only works on the
main thread; called from any other thread, :func:`verify` runs without that bound, so a caller
that verifies off the main thread (a thread pool in the API) must bound it itself (a process
pool with a deadline).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Verification:
    """The verdict on one response.

    ``prediction`` is the boxed text as written; ``parsed_prediction`` and ``parsed_reference``
    are what math-verify understood them as (a sympy expression or a string), printed, or None
    where nothing could be parsed. ``error`` says why a response is wrong when the reason is not
    simply a different value (nothing boxed, unparsable, a timeout).
    """

    correct: bool
    prediction: str | None = None
    parsed_prediction: str | None = None
    parsed_reference: str | None = None
    error: str | None = None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if none.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); an unclosed box at
    the end (a truncated response) does not count.
    """
    starts = [m.end() for m in BOXED_OPEN.finditer(text)]
    for start in reversed(starts):
        content = _balanced(text, start)
        if content is not None:
            return content
    return None


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` up to the brace that closes the one just before it."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_prediction(response: str, require_answer_tag: bool = False) -> str | None:
    """The boxed answer of a response: of the whole text, or only of its last ``<answer>`` block."""
    if require_answer_tag:
        blocks = ANSWER_BLOCK.findall(response)
        if not blocks:
            return None
        response = blocks[-1]
    return last_boxed(response)


def verify(
    response: str,
    reference: str,
    *,
    require_answer_tag: bool = False,
    timeout_s: int = 5,
) -> Verification:
    """Whether the last boxed answer of ``response`` equals ``reference`` mathematically.

    ``reference`` is a bare answer (``12``, ``\\frac{1}{2}``) or one already boxed. With
    ``require_answer_tag`` only a box inside the last ``<answer>...</answer>`` counts. Never
    raises: a failure to parse or a timeout is a wrong answer with ``error`` set.
    """
    prediction = extract_prediction(response, require_answer_tag)
    if prediction is None:
        where = "inside <answer>...</answer>" if require_answer_tag else "in the response"
        return Verification(correct=False, error=f"no \\boxed{{}} answer {where}")
    if not prediction.strip():
        return Verification(correct=False, prediction=prediction, error="the boxed answer is empty")
    reference_box = reference if last_boxed(reference) is not None else f"\\boxed{{{reference}}}"
    return _compare(prediction, reference_box, timeout_s)


def _compare(prediction: str, reference_box: str, timeout_s: int) -> Verification:
    # math-verify is imported here so that importing this module stays cheap (it pulls sympy).
    from math_verify import parse
    from math_verify import verify as math_verify
    from math_verify.errors import TimeoutException  # a BaseException: caught by name

    failures = (Exception, TimeoutException)

    on_main = threading.current_thread() is threading.main_thread()
    timeout: int | None = timeout_s if on_main else None
    try:
        gold = parse(reference_box, parsing_timeout=timeout, raise_on_error=True)
        pred = parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout, raise_on_error=True)
    except failures as exc:  # math-verify raises sympy/antlr/timeout errors of many types
        return Verification(correct=False, prediction=prediction, error=f"parse failed: {exc!r}")
    parsed_pred, parsed_gold = _shown(pred), _shown(gold)
    for parsed, what in ((gold, "reference"), (pred, "prediction")):
        if not parsed:
            error = f"the {what} could not be parsed"
            return Verification(False, prediction, parsed_pred, parsed_gold, error)
    try:
        correct = math_verify(gold, pred, timeout_seconds=timeout, raise_on_error=True)
    except failures as exc:  # as above: the comparison can fail or time out in many ways
        return Verification(False, prediction, parsed_pred, parsed_gold, f"compare failed: {exc!r}")
    return Verification(bool(correct), prediction, parsed_pred, parsed_gold)


def _shown(parsed: list[object]) -> str | None:
    return str(parsed[0]) if parsed else None
