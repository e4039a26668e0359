"""Issue 30, class 7: a program ends as CPython ends it, and a failure stays a failure.

After a main part that succeeded, non-daemon threads are joined and ``atexit`` handlers run, so
the deep-recursion idiom of competitive programming prints its answer on every front. After a
main part that failed, nothing that runs later (a thread, an ``atexit`` handler, an
``excepthook``) turns it into success. Both zygotes; every slot checked after each.
"""

from __future__ import annotations

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import ServiceProcess
from tests.security.every_slot import ZYGOTES, assert_every_slot_answers, module_service

IDIOM = (
    "import sys, threading\n"
    "sys.setrecursionlimit(1 << 20)\n"
    "threading.stack_size(1 << 26)\n"
    "def depth(n):\n"
    "    return 0 if n == 0 else 1 + depth(n - 1)\n"
    "def main():\n"
    "    print(depth(int(sys.stdin.readline())))\n"
    "threading.Thread(target=main).start()\n"
)
# (name, code, stdout of `python prog.py`)
SUCCEEDS = [
    ("the recursion idiom", IDIOM, "100000\n"),
    ("atexit prints", "import atexit\natexit.register(print, 'bye')\nprint('hi')", "hi\nbye\n"),
    (
        "a non-daemon thread finishes late",
        "import threading, time\n"
        "def late():\n    time.sleep(0.3)\n    print('late')\n"
        "threading.Thread(target=late).start()\nprint('main')",
        "main\nlate\n",
    ),
    (
        "threads joined before atexit",
        "import atexit, threading, time\natexit.register(print, 'exit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
        "thread\nexit\n",
    ),
    (
        "an atexit handler raising SystemExit(3) (CPython ignores it)",
        "import atexit, sys\natexit.register(sys.exit, 3)\nprint('done')",
        "done\n",
    ),
]
FAILURES = {
    "atexit exits 0": "import atexit, os\natexit.register(os._exit, 0)\nassert False",
    "excepthook exits 0": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n1 / 0",
    "a non-daemon thread exits 0 later": (
        "import os, threading, time\n"
        "def later():\n    time.sleep(0.3)\n    os._exit(0)\n"
        "threading.Thread(target=later).start()\nraise ValueError('wrong')"
    ),
    "a thread joined by atexit exits 0": (
        "import atexit, os, threading, time\n"
        "t = threading.Thread(target=lambda: (time.sleep(0.2), os._exit(0)), daemon=True)\n"
        "atexit.register(lambda: (t.start(), t.join()))\nsys_exit = 1 / 0"
    ),
    "sys.exit(1) with atexit exiting 0": (
        "import atexit, os, sys\natexit.register(os._exit, 0)\nsys.exit(1)"
    ),
}

service, client = module_service("endings")


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize(("name", "code", "stdout"), SUCCEEDS, ids=[s[0] for s in SUCCEEDS])
def test_a_program_ends_as_cpython_ends_it(client: SandboxClient, zygote: str, name: str,
                                           code: str, stdout: str) -> None:  # fmt: skip
    r = client.execute(ZYGOTES[zygote] + code, stdin="100000\n", timeout_s=20)
    assert (r.status, r.exit_code, r.stdout) == (Status.ok, 0, stdout), f"{name}: {r}"
    assert_every_slot_answers(client, name)


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize("name", list(FAILURES))
def test_what_runs_after_a_failure_cannot_undo_it(client: SandboxClient, zygote: str,
                                                  name: str) -> None:  # fmt: skip
    r = client.execute(ZYGOTES[zygote] + FAILURES[name], timeout_s=20)
    assert r.status is Status.error and r.exit_code == 1, f"{name}: {r.status.value} {r}"
    assert_every_slot_answers(client, name)


def test_the_idiom_on_sandboxfusion(service: ServiceProcess, client: SandboxClient) -> None:
    body = {"language": "python", "code": IDIOM, "stdin": "100000\n", "run_timeout": 20}
    answer = httpx.post(f"{service.url}/run_code", json=body, timeout=60).json()
    assert answer["status"] == "Success", answer
    assert answer["run_result"]["stdout"] == "100000\n", answer
    assert_every_slot_answers(client, "run_code: the idiom")


def test_the_idiom_on_code_judge(service: ServiceProcess, client: SandboxClient) -> None:
    body = {"type": "python", "solution": IDIOM, "input": "100000\n", "expected_output": "100000"}
    answer = httpx.post(f"{service.url}/run", json=body, timeout=60).json()
    assert answer["success"] is True and answer["run_success"] is True, answer
    assert_every_slot_answers(client, "code-judge: the idiom")
