"""Issue 30, class 8: a grader's test mode that the program cannot skip or forge.

An appended assert runs in the program's own process, which can end before it (``os._exit(0)``
at its end, or from a thread racing the checks): that still passes, and is why ``/v1/grade``
exists. There each case is an execution of its own and the API compares what came out with
expected values that never enter the sandbox. Each cheat below must fail every case it
cheats; correct programs pass. After each, every slot still answers correctly.
"""

from __future__ import annotations

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.service_process import ServiceProcess
from tests.security.every_slot import assert_every_slot_answers, module_service

STDIO = [{"stdin": "2 3\n", "expected_stdout": "5"}, {"stdin": "10 -4\n", "expected_stdout": "6"}]
CALLS = [{"args": [2, 3], "expected": 5}, {"args": [[1, 2], [3]], "expected": [1, 2, 3]}]
RIGHT_STDIO = "a, b = map(int, input().split())\nprint(a + b)"
RIGHT_CALL = "def add(a, b):\n    return a + b"
CHEATS = {
    "exit 0 before anything runs": "import os\nos._exit(0)\n",
    "exit 0 at the end of a wrong answer": "def add(a, b):\n    return 0\nprint(0)\nimport os\nos._exit(0)",
    "a thread exits 0 while the checks run": (
        "import os, threading\nthreading.Thread(target=lambda: os._exit(0)).start()\n"
        "def add(a, b):\n    return 0\nimport time\ntime.sleep(1)\nprint(0)"
    ),
    "assert patched away": (
        "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
        "def add(a, b):\n    return 0\nprint(0)"
    ),
    "forged result frames": (
        "import gc, json, sys\nspec = next((o for o in gc.get_objects() if isinstance(o, dict)"
        " and 'nonce' in o), None)\n"
        "if spec:\n    for guess in (5, [1, 2, 3]):\n"
        "        sys.stdout.write(spec['nonce'] + json.dumps({'result': guess}) + spec['nonce'])\n"
        "def add(a, b):\n    return 0\nprint(5)\nprint(6)"
    ),
    "look for the expected values": (
        "import gc, os, sys\nfound = [o for o in gc.get_objects() if isinstance(o, dict) and "
        "('expected' in o or 'expected_stdout' in o)]\nif found:\n    print(found[0].get('expected_stdout'))\n"
        "    sys.stdout.flush()\n    os._exit(0)\nraise SystemExit(1)"
    ),
}

service, client = module_service("grade")


def _grade(service: ServiceProcess, code: str, cases: list[dict]) -> dict:
    body = {"code": code, "function": "add", "cases": cases, "timeout_s": 10}
    answer = httpx.post(f"{service.url}/v1/grade", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_correct_programs_pass(service: ServiceProcess) -> None:
    assert _grade(service, RIGHT_STDIO, STDIO)["passed"] is True
    answer = _grade(service, RIGHT_CALL, CALLS)
    assert answer["passed"] is True, answer
    wrong = _grade(service, "def add(a, b):\n    return a - b", CALLS)
    assert [r["passed"] for r in wrong["results"]] == [False, False], wrong


@pytest.mark.parametrize("name", list(CHEATS))
def test_a_cheat_fails_every_case(
    service: ServiceProcess, client: SandboxClient, name: str
) -> None:
    for cases in (STDIO, CALLS):
        answer = _grade(service, CHEATS[name], cases)
        assert not any(r["passed"] for r in answer["results"]), f"{name}: {answer}"
    # The same cheat against an appended assert, which the mode exists to replace: where it
    # passes, that is the limit docs/SECURITY.md states.
    assert_every_slot_answers(client, f"grade: {name}")


def test_an_appended_assert_is_skipped_by_an_early_exit(client: SandboxClient) -> None:
    """The limit of assert-style grading, stated in docs/SECURITY.md: what the mode is for."""
    r = client.execute(
        "def add(a, b):\n    return 0\nimport os\nos._exit(0)\nassert add(2, 3) == 5"
    )
    assert r.status.value == "ok"


def test_a_case_needs_one_kind(service: ServiceProcess) -> None:
    body = {"code": "pass", "cases": [{"stdin": "", "expected_stdout": "", "args": []}]}
    answer = httpx.post(f"{service.url}/v1/grade", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    body = {"code": "pass", "cases": [{"args": [1]}]}
    assert httpx.post(f"{service.url}/v1/grade", json=body, timeout=30).status_code == 422
