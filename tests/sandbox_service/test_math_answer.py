"""math_answer.py: boxed extraction and math equivalence through math-verify."""

from __future__ import annotations

import threading

import pytest

from sandbox_service.math_answer import extract_prediction, last_boxed, verify


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("<answer>\\boxed{\\{1,2\\}}</answer>", "\\{2,1\\}"),
        ("\\boxed{12}", "\\boxed{12}"),
        ("\\boxed {\\dfrac{3}{4}}", "\\frac34"),
    ],
)
def test_equivalent_answers_are_correct(response: str, reference: str) -> None:
    result = verify(response, reference)
    assert result.correct, result
    assert result.error is None


def test_wrong_answer_is_wrong_and_says_what_was_parsed() -> None:
    result = verify("I think \\boxed{13}", "12")
    assert not result.correct
    assert result.prediction == "13"
    assert result.parsed_prediction == "13"
    assert result.parsed_reference == "12"
    assert result.error is None


def test_missing_box_is_wrong_with_an_error() -> None:
    result = verify("the answer is 12", "12")
    assert not result.correct
    assert result.prediction is None
    assert result.error is not None and "boxed" in result.error


def test_empty_box_is_wrong() -> None:
    result = verify("\\boxed{}", "12")
    assert not result.correct
    assert result.error == "the boxed answer is empty"


def test_nested_braces_are_balanced() -> None:
    text = "first \\boxed{1} then \\boxed{\\frac{a^{2}}{b_{1}}} end"
    assert last_boxed(text) == "\\frac{a^{2}}{b_{1}}"
    assert verify("\\boxed{\\frac{\\sqrt{4}}{2}}", "1").correct


def test_last_box_wins_and_an_unclosed_box_does_not_count() -> None:
    assert last_boxed("\\boxed{3} and \\fbox{4}") == "4"
    assert last_boxed("\\boxed{3} then \\boxed{\\frac{1}{") == "3"
    assert verify("\\boxed{3} no wait \\boxed{4}", "4").correct
    assert not verify("\\boxed{4} no wait \\boxed{3}", "4").correct


def test_answer_tag_requirement() -> None:
    response = "scratch \\boxed{5} <answer>\\boxed{7}</answer> later \\boxed{5}"
    assert extract_prediction(response, require_answer_tag=True) == "7"
    assert extract_prediction(response) == "5"
    assert verify(response, "7", require_answer_tag=True).correct
    untagged = verify("\\boxed{7}", "7", require_answer_tag=True)
    assert not untagged.correct
    assert untagged.error is not None and "<answer>" in untagged.error


def test_unparsable_reference_is_an_error_not_an_exception() -> None:
    result = verify("\\boxed{1}", "")
    assert not result.correct
    assert result.error == "the reference could not be parsed"


def test_works_off_the_main_thread() -> None:
    # math-verify's SIGALRM timeout cannot be armed off the main thread; verify must not crash.
    out: list[bool] = []
    thread = threading.Thread(target=lambda: out.append(verify("\\boxed{0.5}", "1/2").correct))
    thread.start()
    thread.join(timeout=60)
    assert out == [True]
