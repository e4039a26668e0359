"""The command line: ``run FILE`` prints like Python would; ``--help`` documents every setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service.executor import uids
from sandbox_service.settings import Settings

CLI = [sys.executable, "-m", "sandbox_service.cli"]


def test_help_lists_every_setting() -> None:
    out = subprocess.run(
        [*CLI, "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in out
    assert "SANDBOX_" in out and "number of CPUs" in out


def test_run_file(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text(
        "import sys\nprint(input().upper())\nprint('warn', file=sys.stderr)\nsys.exit(4)\n"
    )
    stdin = tmp_path / "in.txt"
    stdin.write_text("hello\n")
    done = subprocess.run(
        [*CLI, "run", str(program), "--stdin-file", str(stdin), "--preload", "math"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 4
    assert done.stdout == "HELLO\n"
    assert "warn" in done.stderr and "[sandbox] error" in done.stderr


def test_run_json_and_timeout_exit_code(tmp_path: Path) -> None:
    program = tmp_path / "loop.py"
    program.write_text("while True: pass\n")
    done = subprocess.run(
        [*CLI, "run", str(program), "--timeout", "0.5", "--json", "--preload", "math"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 124
    assert json.loads(done.stdout)["status"] == "timeout"


def test_invalid_setting_is_reported() -> None:
    done = subprocess.run([*CLI, "serve", "--slots", "zero"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid setting slots" in done.stderr


def test_a_preload_that_fails_stops_start_up(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    done = subprocess.run(
        [*CLI, "run", str(program), "--preload", "math,no_such_module_here"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "preload failed: no_such_module_here" in done.stderr


def test_run_help_shows_its_own_options_and_the_settings_on_request() -> None:
    own = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, check=True)
    assert "--timeout" in own.stdout and "--help-settings" in own.stdout
    assert "--preload" not in own.stdout and "SANDBOX_<NAME>" not in own.stdout
    listed = subprocess.run([*CLI, "run", "--help-settings"], capture_output=True, text=True,
                            check=True)  # fmt: skip
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in listed.stdout


def test_run_beside_a_service_that_holds_the_default_uids_says_nothing_of_it(
    tmp_path: Path,
) -> None:
    """The one-off slot moves to the next free uid range, as expected, without a warning."""
    if os.geteuid() != 0:
        pytest.skip("slot uids are claimed only when running as root")
    program = tmp_path / "prog.py"
    program.write_text("print(6 * 7)\n")
    held = uids.claim(Settings().uid_base, 1, movable=True)  # what a running service holds
    try:
        done = subprocess.run([*CLI, "run", str(program), "--preload", "math"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        held.release()
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr
    assert "in use by another service" not in done.stderr, done.stderr
