"""code-judge's API as a target: the payload rStar2-Agent sends, answers read back natively."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from loadtests.generator import Plan, Recorder, drive
from loadtests.targets import CodeJudgeTarget, native_of_codejudge, submission
from loadtests.workloads import Item
from sandbox_service.service_process import ServiceProcess

ITEMS = [
    Item("print", {"code": "print(6 * 7)"}, "42\n"),
    Item("repl", {"code": "x = 6\nx * 7", "mode": "repl"}, "42\n"),
    Item("error", {"code": "1/0"}, "", frozenset({"error"})),
    Item("stdin", {"code": "print(input()[::-1])", "stdin": "abc\n"}, "cba\n"),
]


@pytest.mark.parametrize("batch", [1, 4])
def test_our_code_judge_front_answers_through_the_target(
    own_service: ServiceProcess, batch: int
) -> None:
    recorder = Recorder()
    plan = Plan(8, concurrency=4, batch=batch)
    asyncio.run(drive(CodeJudgeTarget(own_service.url), ITEMS * 2, plan, recorder))
    assert (recorder.answered, recorder.lost, recorder.wrong) == (8, 0, 0), recorder.wrong_examples
    assert recorder.statuses == {"ok": 6, "error": 2}
    assert all(t > 0 for t in recorder.run_time)  # code-judge's cost


def test_every_batch_is_a_long_batch_of_submissions() -> None:
    path, body = CodeJudgeTarget("http://127.0.0.1:9").request(ITEMS[:1])
    assert path == "/run/long-batch"
    sub = {"type": "python", "solution": "print(6 * 7)", "input": ""}
    assert orjson.loads(body) == {"type": "batch", "submissions": [sub]}
    assert "print(repr(_value))" in submission(ITEMS[1].request)["solution"]
    with pytest.raises(ValueError, match="files"):
        submission({"code": "print(1)", "files": {"a.txt": "eA=="}})


def test_reasons_become_native_statuses() -> None:
    ran = {"run_success": True, "success": True, "stdout": "1\n", "stderr": "", "cost": 0.5}
    assert native_of_codejudge(ran) == {"status": "ok", "stdout": "1\n", "stderr": "",
                                        "wall_time_s": 0.5, "message": ""}  # fmt: skip
    failed = {"run_success": False, "success": False, "cost": 0.1, "reason": ""}
    assert native_of_codejudge(failed)["status"] == "error"
    for reason, status in [("worker_timeout", "timeout"), ("queue_timeout", "queue_timeout"),
                           ("internal_error", "internal_error")]:  # fmt: skip
        answer = native_of_codejudge({**failed, "reason": reason, "stdout": None})
        assert (answer["status"], answer["stdout"], answer["message"]) == (status, "", reason)
