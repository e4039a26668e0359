"""A newcomer's path, as the README's first screen tells it: a clone of the repository under
/tmp, a fresh venv there, `pip install .`, `sandbox-service serve` started from the clone and,
separately, from /tmp; then every example of that screen (the curl lines and the Python
snippet), run as written but for the port, with their output checked.

Slow (a real `pip install .` into an empty venv, ~1 minute from a warm pip cache); in the main
suite because no engine is needed and it is the first thing every user does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_SCREEN = ROOT.joinpath("README.md").read_text().split("\n## ", 1)[0]
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(FIRST_SCREEN) if lang == language]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clone, with `pip install .` done in a fresh venv inside it, as the README says."""
    [setup, *_] = blocks("bash")
    assert "pip install . && sandbox-service serve" in setup
    clone = tmp_path_factory.mktemp("newcomer") / "sandbox-service"
    assert str(clone).startswith("/tmp/")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True, timeout=120)
    done = subprocess.run([str(clone / ".venv/bin/pip"), "install", "--quiet", "."], cwd=clone,
                          capture_output=True, text=True, timeout=540)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return clone


def curl_examples(port: int) -> list[list[str]]:
    """The README's curl lines, as argument lists, pointed at ``port``."""
    lines = [line for body in blocks("bash") for line in body.splitlines()]
    return [shlex.split(line.replace("localhost:8000", f"localhost:{port}"))
            for line in lines if line.startswith("curl ")]  # fmt: skip


def check_examples(clone: Path, port: int) -> None:
    single, batch = (json.loads(subprocess.run(argv, capture_output=True, text=True, check=True,
                                               timeout=60).stdout)
                     for argv in curl_examples(port))  # fmt: skip
    assert (single["status"], single["stdout"]) == ("ok", "(x - 1)*(x + 1)\n"), single
    assert [r["status"] for r in batch["results"]] == ["ok", "error"], batch
    assert batch["results"][0]["stdout"] == "1\n" and "ZeroDivisionError" in batch["results"][1][
        "stderr"]  # fmt: skip
    [snippet] = blocks("python")
    snippet = snippet.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
    ran = subprocess.run([str(clone / ".venv/bin/python"), "-c", snippet], cwd="/tmp",
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # The snippet's comment: "42\n" Status.timeout
    assert (ran.returncode, ran.stdout) == (0, "42\n Status.timeout\n"), ran.stderr


@pytest.mark.parametrize("started_in", ["clone", "/tmp"])
def test_first_screen_works_from_a_fresh_clone(installed: Path, started_in: str) -> None:
    port = free_port()
    cwd = installed if started_in == "clone" else Path("/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    # Only the port differs from `sandbox-service serve`: 8000 may be taken on a shared machine.
    env["SANDBOX_PORT"] = str(port)
    log = installed.parent / f"serve-{port}.log"
    with open(log, "wb") as out:
        service = subprocess.Popen([str(installed / ".venv/bin/sandbox-service"), "serve"],
                                   cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not _ready(port):
            assert service.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        check_examples(installed, port)
        service.send_signal(signal.SIGTERM)
        assert service.wait(60) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(10)
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _session(int(p)) == service.pid]
    assert leftovers == [], leftovers


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None
