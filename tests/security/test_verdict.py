"""Issue 21, class 4: the program cannot forge the service's verdict.

Written as an attacker would: each program below tries to be answered with a status that says
the service, or one of its limits, ended it (``internal_error``, ``timeout``, ``memory_limit``,
``killed``, and their SandboxFusion / code-judge words), which trainers retry or mask instead of
penalising. Each must be answered as what it is, the program's own error (or ok), on both
zygotes of a slot; after each one every slot still answers correctly.
"""

from __future__ import annotations

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import ServiceProcess
from tests.security.every_slot import ZYGOTES, assert_every_slot_answers, module_service

# (name, code, the status it must get): each tries to claim a service status it has not earned.
FORGERIES = [
    (
        "setup_error on the status pipe, then fail",
        "import os\nos.write(3, b'setup_error: forged')\n1/0",
        Status.error,
    ),
    (
        "setup_error on the status pipe, then succeed",
        "import os\nos.write(3, b'setup_error: forged')",
        Status.error,
    ),  # fd 3 is closed: OSError
    (
        "memory_error on the status pipe",
        "import os\nos.write(3, b'memory_error\\n')\nraise SystemExit(1)",
        Status.error,
    ),
    (
        "setup_error on every descriptor",
        "import os\nfor fd in range(3, 256):\n    try: os.write(fd, b'setup_error: forged')\n"
        "    except OSError: pass\nraise SystemExit(1)",
        Status.error,
    ),
    (
        "the status pipe through /proc/self/fd",
        "import os\nfd = os.open('/proc/self/fd/3', os.O_WRONLY)\nos.write(fd, b'setup_error: x')",
        Status.error,
    ),
    ("exit with the setup-failure code", "import os\nos._exit(125)", Status.error),
    (
        "SIGXCPU to itself after 7 ms",
        "import os, signal, time\ntime.sleep(0.007)\nos.kill(os.getpid(), signal.SIGXCPU)",
        Status.error,
    ),
    ("SIGXCPU by raise_signal", "import signal\nsignal.raise_signal(signal.SIGXCPU)", Status.error),
    (
        "SIGXCPU from its own child",
        "import os, signal, time\nif os.fork() == 0:\n    os.kill(os.getppid(), signal.SIGXCPU)\n"
        "    os._exit(0)\ntime.sleep(5)",
        Status.error,
    ),
    (
        "a lowered CPU limit of its own",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, resource.getrlimit("
        "resource.RLIMIT_CPU)[1]))\nwhile True: pass",
        Status.error,
    ),
    ("SIGKILL to itself", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", Status.error),
    (
        "SIGKILL to its process group",
        "import os, signal\nos.killpg(0, signal.SIGKILL)",
        Status.error,
    ),
    ("a MemoryError it raised itself", "raise MemoryError('fake')", Status.error),
    (
        "a MemoryError traceback printed, exit 1",
        "import sys\nsys.stderr.write('Traceback (most recent call last):\\nMemoryError\\n')\n"
        "sys.exit(1)",
        Status.error,
    ),
    ("a huge allocation refused at once", "b = bytearray(64 * 1024**3)", Status.error),
]
# Controls: the limits themselves still give their statuses.
EARNED = [
    ("wall clock", "while True: pass", Status.timeout, {"timeout_s": 1}),
    (
        "memory growing to the limit",
        "x = []\nwhile True: x.append(' ' * 10**7)",
        Status.memory_limit,
        {"memory_mb": 200},
    ),
]


service, client = module_service("verdict")


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize(("name", "code", "expected"), FORGERIES, ids=[f[0] for f in FORGERIES])
def test_a_forged_status_is_the_programs_own(client: SandboxClient, zygote: str, name: str,
                                             code: str, expected: Status) -> None:  # fmt: skip
    r = client.execute(ZYGOTES[zygote] + code, timeout_s=10)
    assert r.status is expected, f"{name}: {r.status.value} {r.message!r} {r.stderr[-200:]!r}"
    assert_every_slot_answers(client, name)


@pytest.mark.parametrize("zygote", list(ZYGOTES))
@pytest.mark.parametrize(("name", "code", "expected", "limits"), EARNED, ids=[e[0] for e in EARNED])
def test_a_limit_reached_is_still_its_status(client: SandboxClient, zygote: str, name: str,
                                             code: str, expected: Status, limits: dict) -> None:  # fmt: skip
    r = client.execute(ZYGOTES[zygote] + code, **limits)
    assert r.status is expected, f"{name}: {r.status.value} {r.message!r}"


def test_sigxcpu_at_the_cpu_limit_is_a_timeout(client: SandboxClient) -> None:
    """Four spinning threads reach the CPU limit (2 s) before the wall clock (30 s) on any
    machine with two cores: the kernel's SIGXCPU, with the CPU spent, is a timeout."""
    code = ("import threading\ndef spin():\n    while True: pass\n"
            "for _ in range(4): threading.Thread(target=spin).start()\nspin()")  # fmt: skip
    r = client.execute(code, timeout_s=0.9)
    assert r.status is Status.timeout


SANDBOXFUSION_FORGERIES = [f for f in FORGERIES if f[2] is Status.error][:12]


@pytest.mark.parametrize(("name", "code", "expected"), SANDBOXFUSION_FORGERIES,
                         ids=[f[0] for f in SANDBOXFUSION_FORGERIES])  # fmt: skip
def test_sandboxfusion_sees_a_failed_program(service: ServiceProcess, client: SandboxClient,
                                             name: str, code: str, expected: Status) -> None:  # fmt: skip
    """Not SandboxError (verl retries it), not TimeLimitExceeded: Finished and Failed."""
    body = {"language": "python", "code": code, "run_timeout": 10}
    answer = httpx.post(f"{service.url}/run_code", json=body, timeout=60).json()
    assert answer["status"] == "Failed", f"{name}: {answer}"
    assert answer["run_result"]["status"] == "Finished", f"{name}: {answer}"
    assert_every_slot_answers(client, f"run_code: {name}")


@pytest.mark.parametrize(("name", "code", "expected"), SANDBOXFUSION_FORGERIES,
                         ids=[f[0] for f in SANDBOXFUSION_FORGERIES])  # fmt: skip
def test_codejudge_sees_a_failed_program(service: ServiceProcess, client: SandboxClient,
                                         name: str, code: str, expected: Status) -> None:  # fmt: skip
    """Not reason internal_error or worker_timeout (rStar2-Agent's tool masks those)."""
    body = {"type": "python", "solution": code}
    answer = httpx.post(f"{service.url}/run", json=body, timeout=60).json()
    assert answer["reason"] == "" and answer["run_success"] is False, f"{name}: {answer}"
    assert_every_slot_answers(client, f"code-judge: {name}")


def test_a_session_cell_cannot_forge_either(client: SandboxClient) -> None:
    """Through the session driver (replayed cells, then the new one) as well. There a low
    descriptor may be one of the driver's own pipes, which a cell can write into (ok, or
    error): never a status of the service's."""
    first = client.execute("x = 1", session_id="forger")
    assert first.status is Status.ok
    for name, code, _ in FORGERIES[:8]:
        r = client.execute(code, session_id="forger", timeout_s=10)
        assert r.status in (Status.error, Status.ok), (
            f"session, {name}: {r.status.value} {r.message!r}"
        )
    assert_every_slot_answers(client, "session forgeries")
