"""SandboxFusion's API, spoken by its own client package and shaped as verl sends it."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, RunJupyterRequest, run_code, run_jupyter

from sandbox_service.api.compat import OUTCOMES
from sandbox_service.api.sandboxfusion import command_result, run_status
from sandbox_service.models import ExecuteResult, Status
from sandbox_service.service_process import ServiceProcess
from tests.helpers import queue_held_full


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_client_package_runs_code_with_stdin(compat_service: ServiceProcess) -> None:
    request = RunCodeRequest(code="print(int(input()) * 2)", stdin="21", language="python")
    response = run_code(request, endpoint=compat_service.url)
    assert response.status == "Success" and response.message == ""
    assert response.compile_result is None
    run = response.run_result
    assert run is not None and run.status == "Finished"
    assert (run.return_code, run.stdout, run.stderr) == (0, "42\n", "")
    assert run.execution_time is not None and run.execution_time > 0


def test_failures_are_finished_and_failed(compat_service: ServiceProcess) -> None:
    response = run_code(RunCodeRequest(code="1/0", language="python"), endpoint=compat_service.url)
    run = response.run_result
    assert response.status == "Failed" and run is not None
    assert run.status == "Finished" and run.return_code == 1
    assert run.stderr.endswith("ZeroDivisionError: division by zero\n")
    exited = run_code(
        RunCodeRequest(code="import sys; sys.exit(3)", language="python"),
        endpoint=compat_service.url,
    )
    assert exited.status == "Failed" and exited.run_result.return_code == 3


def test_time_limit(compat_service: ServiceProcess) -> None:
    request = RunCodeRequest(code="print('started', flush=True)\nwhile True: pass",
                             language="python", run_timeout=0.5)  # fmt: skip
    response = run_code(request, endpoint=compat_service.url)
    run = response.run_result
    assert response.status == "Failed" and run.status == "TimeLimitExceeded"
    assert run.return_code is None and run.stdout == "started\n"
    assert 0.5 <= run.execution_time < 5


def test_memory_and_output_limits_are_finished_and_failed(compat_service: ServiceProcess) -> None:
    body = {"language": "python", "memory_limit_MB": 64, "code": "x = bytearray(512 << 20)"}
    memory = httpx.post(f"{compat_service.url}/run_code", json=body, timeout=30).json()
    assert memory["status"] == "Failed" and memory["run_result"]["status"] == "Finished"
    assert (
        memory["run_result"]["return_code"] == 1 and "MemoryError" in memory["run_result"]["stderr"]
    )
    body = {"language": "python", "code": "while True: print('x' * 1000)"}
    flood = httpx.post(f"{compat_service.url}/run_code", json=body, timeout=30).json()
    assert flood["status"] == "Failed" and flood["run_result"]["status"] == "Finished"
    assert flood["run_result"]["return_code"] == -9


def test_files_in_and_fetch_files_out(compat_service: ServiceProcess) -> None:
    code = (
        "import os\n"
        "data = open('in/data.txt').read()\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/upper.txt', 'w').write(data.upper())\n"
        "open('raw.bin', 'wb').write(bytes(range(256)))\n"
        "print('done', end='')\n"
        "raise SystemExit(2)\n"
    )
    request = RunCodeRequest(code=code, language="python",
                             files={"in/data.txt": _b64(b"abc"), "ignored.txt": None},
                             fetch_files=["out/upper.txt", "raw.bin", "missing.txt"])  # fmt: skip
    response = run_code(request, endpoint=compat_service.url)
    assert response.status == "Failed" and response.run_result.return_code == 2
    assert response.run_result.stdout == "done" and response.run_result.stderr == ""
    assert set(response.files) == {"out/upper.txt", "raw.bin"}
    assert base64.b64decode(response.files["out/upper.txt"]) == b"ABC"
    assert base64.b64decode(response.files["raw.bin"]) == bytes(range(256))


def test_verl_shaped_request_and_reading(compat_service: ServiceProcess) -> None:
    """Exactly what verl's call_sandbox_api sends, read as its _process_single_case and
    SandboxFusionTool.execute_code read it."""
    payload = json.dumps({
        "compile_timeout": 30, "run_timeout": 30, "code": "import sys\nprint(sum(range(10)))\n"
        "print('warn', file=sys.stderr)", "stdin": None, "memory_limit_MB": 1024,
        "language": "python", "files": {}, "fetch_files": [],
    })  # fmt: skip
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = httpx.post(f"{compat_service.url}/run_code", content=payload, headers=headers,
                          timeout=70)  # fmt: skip
    assert response.status_code == 200
    api = response.json()
    assert api["status"] == "Success" and api["run_result"]["status"] == "Finished"
    tool_text = api["run_result"]["stdout"] + api["run_result"]["stderr"]
    assert tool_text == "45\nwarn\n"


def test_null_limits_mean_the_defaults(compat_service: ServiceProcess) -> None:
    """verl's default_compute_score passes memory_limit_mb=None down to call_sandbox_api's
    payload ("memory_limit_MB": null); a 422 there scored every code reward 0."""
    verl_default = {
        "compile_timeout": 10, "run_timeout": 10, "code": "print(input()[::-1])",
        "stdin": "abc", "memory_limit_MB": None, "language": "python", "files": {},
        "fetch_files": [],
    }  # fmt: skip
    all_null = {**verl_default, "compile_timeout": None, "run_timeout": None}
    for body in (verl_default, all_null):
        response = httpx.post(f"{compat_service.url}/run_code", json=body, timeout=30)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "cba\n"
    notebook = {"cells": ["x = 6", "print(x * 7)"], "cell_timeout": None,
                "total_timeout": None, "memory_limit_MB": None}  # fmt: skip
    response = httpx.post(f"{compat_service.url}/run_jupyter", json=notebook, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["cells"][1]["stdout"] == "42\n"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"code": "print(1)", "language": "go"}, "language 'go'"),
        ({"code": "print(1)", "language": "python", "run_timeout": 0}, "run_timeout"),
        ({"code": "print(1)", "language": "python", "files": {"a": "@@"}}, "files"),
        ({"code": "1", "language": "python", "files": {"/etc/x": "eA=="}}, "absolute"),
    ],
)
def test_what_it_cannot_run_is_a_sandbox_error(compat_service: ServiceProcess, body: dict,
                                               words: str) -> None:  # fmt: skip
    response = httpx.post(f"{compat_service.url}/run_code", json=body, timeout=30)
    assert response.status_code == 200
    answer = response.json()
    assert answer["status"] == "SandboxError" and words in answer["message"]
    assert answer["run_result"] is None


def test_server_limits(compat_service: ServiceProcess, tight_service: ServiceProcess) -> None:
    big = {"code": "#" * 1001, "language": "python"}
    answer = httpx.post(f"{tight_service.url}/run_code", json=big, timeout=30).json()
    assert (
        answer["status"] == "SandboxError" and "code, in characters, is 1001" in answer["message"]
    )
    # SandboxFusion has no maxima: a longer limit than this server allows is lowered, not refused
    body = {"code": "print(1)", "language": "python", "run_timeout": 999, "memory_limit_MB": 10**6}
    answer = httpx.post(f"{compat_service.url}/run_code", json=body, timeout=30).json()
    assert answer["status"] == "Success"


def test_bad_shape_is_fastapi_422(compat_service: ServiceProcess) -> None:
    response = httpx.post(f"{compat_service.url}/run_code", json={"code": "1"}, timeout=30)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "language"]
    response = httpx.post(f"{compat_service.url}/run_jupyter", content=b"{", timeout=30)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"


def test_ping(compat_service: ServiceProcess) -> None:
    assert httpx.get(f"{compat_service.url}/v1/ping").json() == "pong"


def test_jupyter_cells_share_one_interpreter(compat_service: ServiceProcess) -> None:
    cells = ["a = 123", "a", "print(a)", 'import sys; sys.stderr.write("stderr message")',
             'raise RuntimeError("error message")', "a + 1"]  # fmt: skip
    response = run_jupyter(RunJupyterRequest(cells=cells), endpoint=compat_service.url)
    assert response.status == "Success" and response.driver.status == "Finished"
    out = [(c.stdout, c.stderr, c.display) for c in response.cells]
    assert out[:4] == [
        ("", "", []),
        ("", "", [{"text/plain": "123"}]),
        ("123\n", "", []),
        ("", "stderr message", [{"text/plain": "14"}]),
    ]
    [error] = response.cells[4].error
    assert (error["ename"], error["evalue"]) == ("RuntimeError", "error message")
    assert "RuntimeError: error message\n" in error["traceback"][-1]
    assert response.cells[5].display == [{"text/plain": "124"}] and response.cells[5].error == []


def test_jupyter_cell_and_total_timeouts(compat_service: ServiceProcess) -> None:
    body = {"cells": ["x = 1", "while True: pass", "print(x)"], "cell_timeout": 0.3,
            "fetch_files": ["f.txt"], "files": {"f.txt": _b64(b"kept")}}  # fmt: skip
    answer = httpx.post(f"{compat_service.url}/run_jupyter", json=body, timeout=30).json()
    assert answer["status"] == "Success"
    assert answer["cells"][1]["error"][0]["ename"] == "TimeoutError"
    assert answer["cells"][2]["stdout"] == "1\n"
    assert base64.b64decode(answer["files"]["f.txt"]) == b"kept"
    body = {"cells": ["print('first')", "print('second', flush=True)\nwhile True: pass"],
            "total_timeout": 0.5}  # fmt: skip
    answer = httpx.post(f"{compat_service.url}/run_jupyter", json=body, timeout=30).json()
    assert answer["status"] == "Failed" and answer["driver"]["status"] == "TimeLimitExceeded"
    assert [c["stdout"] for c in answer["cells"]] == ["first\n"]
    assert answer["driver"]["stdout"] == "second\n"


def test_full_queue_is_a_retryable_504(tight_service: ServiceProcess) -> None:
    with queue_held_full(tight_service.url):
        body = {"code": "print(1)", "language": "python"}
        response = httpx.post(f"{tight_service.url}/run_code", json=body)
    assert response.status_code == 504 and response.headers["retry-after"] == "1"
    assert "queue is full" in response.json()["detail"]


@pytest.mark.parametrize("status", list(Status))
def test_every_native_status_has_a_sandboxfusion_reading(status: Status) -> None:
    result = ExecuteResult(status=status, exit_code=None if status is Status.timeout else 1,
                           stdout="o", stderr="e", message="why", wall_time_s=0.1)  # fmt: skip
    if status is Status.ok:
        result.exit_code = 0
    command = command_result(result, result.stdout, result.stderr)
    overall, message = run_status(command, result)
    expected = {
        Status.ok: ("Finished", "Success"),
        Status.timeout: ("TimeLimitExceeded", "Failed"),
        Status.queue_timeout: ("Error", "SandboxError"),
        Status.rejected: ("Error", "SandboxError"),
        Status.internal_error: ("Error", "SandboxError"),
    }.get(status, ("Finished", "Failed"))
    assert (command.status, overall) == expected
    assert command.status == OUTCOMES[status].fusion
    if overall == "SandboxError":
        assert message == "why" and command.stderr == "why"
