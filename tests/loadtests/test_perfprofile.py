"""perf profiles of a mode's processes, read back by role (where perf is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from loadtests.cpu import Roles, fixed
from loadtests.perfprofile import Profile, ProfiledMeter
from tests.loadtests.forker import run_forker

pytestmark = pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")


def test_the_forked_executions_are_followed_and_told_apart(
    forker: subprocess.Popen[str], tmp_path: Path
) -> None:
    sink: list[Profile] = []
    path = str(tmp_path / "p.data")
    meter = ProfiledMeter(Roles({"zygote": fixed(forker.pid)}), path=path, name="t", sink=sink)
    meter.begin()
    run_forker(forker)
    cpu, _ = meter.end(4)
    [profile] = sink
    assert profile.path == path and Path(path).stat().st_size > 0
    # The children burn 0.8 s of user CPU in the interpreter; the parent only forks and waits.
    assert profile.roles["children"] > 80, profile.lines()
    assert any(sym.startswith("[.] ") for sym, _ in profile.symbols["children"])
    assert cpu["children"][0] >= 180
    assert profile.lines()[0].startswith("t: ")
