"""code-judge's API, with requests shaped and results read exactly as its own client
(``judge_client.py``) and the rStar2-Agent release (``call_long_batch``) do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import httpx
import pytest

from sandbox_service.api.codejudge import Reason, Submission, _result
from sandbox_service.api.compat import OUTCOMES
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.service_process import ServiceProcess
from tests.helpers import queue_held_full


# code-judge's client dataclasses: building them from our answers fails on any missing or
# extra key, as it would in a trainer.
@dataclass
class JudgeSubmission:
    type: Literal["python", "cpp", "math"]
    solution: str
    input: str | None = None
    expected_output: str | None = None


@dataclass
class SubmissionResult:
    sub_id: str
    success: bool
    run_success: bool
    cost: float
    stdout: str | None = None
    stderr: str | None = None
    reason: str = ""


@dataclass
class ServerStatus:
    queue: int
    num_workers: int


def _long_batch(url: str, submissions: list[JudgeSubmission]) -> list[SubmissionResult]:
    body = {"type": "batch", "submissions": [asdict(s) for s in submissions]}
    response = httpx.post(f"{url}/run/long-batch", json=body, timeout=60)
    response.raise_for_status()
    return [SubmissionResult(**r) for r in response.json()["results"]]


def test_long_batch_in_order_with_judging(compat_service: ServiceProcess) -> None:
    subs = [
        JudgeSubmission("python", "print(input())", "9", "9"),
        JudgeSubmission("python", "print(int(input()) + 1)", "9", " 11 \n"),
        JudgeSubmission("python", "import fractions\nprint(fractions.Fraction(1, 3) * 6)"),
        JudgeSubmission("python", "1/0"),
        *[JudgeSubmission("python", f"print({i})") for i in range(12)],
    ]
    results = _long_batch(compat_service.url, subs)
    assert [(r.success, r.run_success, r.reason) for r in results[:4]] == [
        (True, True, ""), (False, True, ""), (True, True, ""), (False, False, ""),
    ]  # fmt: skip
    assert results[2].stdout == "2\n"
    assert (results[3].stderr or "").startswith("Traceback") and results[3].cost > 0
    assert [r.stdout for r in results[4:]] == [f"{i}\n" for i in range(12)]
    assert len({r.sub_id for r in results}) == len(results)


def test_rstar2_agent_reads_a_tool_call(compat_service: ServiceProcess) -> None:
    """As rStar2-Agent's run_tool_calls_on_server_async builds and reads its tool responses."""
    data = {"type": "batch", "submissions": [
        {"type": "python", "solution": "n = int(input())\nprint(n * n)", "input": "12"},
        {"type": "python", "solution": "import sys\nprint('bad', file=sys.stderr)\nsys.exit(1)",
         "input": None},
    ]}  # fmt: skip
    response = httpx.post(f"{compat_service.url}/run/long-batch", json=data, timeout=60)
    response.raise_for_status()
    texts = []
    for result in response.json()["results"]:
        assert result["reason"] != "queue_timeout"
        head = "Tool call success" if result["run_success"] and result["success"] else (
            f"Tool call failure\nreason: {result['reason']}")  # fmt: skip
        texts.append(f"{head}\nstdout: {result['stdout']}stderr: {result['stderr']}"
                     f"execution time: {result['cost']:.2f}s")  # fmt: skip
    assert texts[0].startswith("Tool call success\nstdout: 144\n")
    assert texts[1].startswith("Tool call failure\nreason: \nstdout: stderr: bad\n")


def test_single_run_judge_and_batches(compat_service: ServiceProcess) -> None:
    url = compat_service.url
    run = httpx.post(f"{url}/run", json={"type": "python", "solution": "print(9)",
                                         "sub_id": "mine"}).json()  # fmt: skip
    assert SubmissionResult(**run) == SubmissionResult(
        "mine", True, True, run["cost"], "9\n", "", ""
    )
    judged = httpx.post(f"{url}/judge", json={"type": "python", "solution": "print(9)",
                                              "expected_output": "8"}).json()  # fmt: skip
    assert set(judged) == {"sub_id", "success", "run_success", "cost", "reason"}
    assert (judged["success"], judged["run_success"]) == (False, True)
    batch = {"sub_id": "b1", "submissions": [{"type": "python", "solution": "print(2)",
                                              "expected_output": "2"}]}  # fmt: skip
    for path in ("/run/batch", "/judge/batch", "/judge/long-batch"):
        answer = httpx.post(f"{url}{path}", json=batch, timeout=30).json()
        assert answer["sub_id"] == "b1" and answer["results"][0]["success"] is True
        assert ("stdout" in answer["results"][0]) == path.startswith("/run")


def test_worker_timeout_and_output_cut(compat_service: ServiceProcess) -> None:
    [slow, loud] = _long_batch(compat_service.url, [
        JudgeSubmission("python", "print('begun', flush=True)\nwhile True: pass"),
        JudgeSubmission("python", "print('y' * 5000)"),
    ])  # fmt: skip
    assert (slow.success, slow.run_success, slow.reason) == (False, False, "worker_timeout")
    assert slow.stdout == "begun\n" and 1 <= slow.cost < 5  # codejudge_timeout_s=1 here
    assert loud.run_success and loud.stdout == "y" * 100  # codejudge_max_output_chars=100


def test_bad_input_in_code_judge_style(compat_service: ServiceProcess) -> None:
    url = compat_service.url
    results = _long_batch(url, [
        JudgeSubmission("math", "1 + 1"),
        JudgeSubmission("python", "print('still runs')"),
    ])  # fmt: skip
    assert results[0].reason == "invalid_input" and "type 'math'" in (results[0].stderr or "")
    assert not results[0].run_success and results[1].stdout == "still runs\n"
    missing = httpx.post(f"{url}/run", json={"type": "python"})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "solution"]
    unknown = httpx.post(f"{url}/run/long-batch",
                         json={"submissions": [{"type": "java", "solution": "x"}]})  # fmt: skip
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["loc"] == ["body", "submissions", 0, "type"]
    empty = httpx.post(f"{url}/run/batch", json={"type": "batch", "submissions": []})
    assert empty.status_code == 422


def test_ping_and_status(compat_service: ServiceProcess) -> None:
    assert httpx.get(f"{compat_service.url}/ping").json() == "pong"
    assert ServerStatus(**httpx.get(f"{compat_service.url}/status").json()).num_workers == 2


def test_full_queue_answers_queue_timeout(tight_service: ServiceProcess) -> None:
    with queue_held_full(tight_service.url):
        results = _long_batch(tight_service.url, [JudgeSubmission("python", "print(1)")])
    assert results[0].reason == "queue_timeout" and "queue is full" in (results[0].stderr or "")
    assert not results[0].run_success


@pytest.mark.parametrize("status", list(Status))
def test_every_native_status_has_a_code_judge_reason(status: Status) -> None:
    result = ExecuteResult(status=status, exit_code=0 if status is Status.ok else 1,
                           stdout="out", message="why", wall_time_s=0.5, queue_time_s=0.25)  # fmt: skip
    judged = _result(Submission(type="python", solution="x"), "id", result, 0)
    assert judged.reason == Reason(OUTCOMES[status].judge)
    assert judged.run_success is (status is Status.ok)
    expected = {Status.timeout: "worker_timeout", Status.queue_timeout: "queue_timeout",
                Status.rejected: "queue_timeout", Status.internal_error: "internal_error"}  # fmt: skip
    assert judged.reason.value == expected.get(status, "")
    if not OUTCOMES[status].ran:
        assert (judged.cost, judged.stdout, judged.stderr) == (0.25, "", "why")
