"""``python -m loadtests.fairness``: its flags, and a short run end to end (the figures of a
real run are in docs/benchmarks.md; here only that every phase ran and was counted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.fairness import Tally, arguments


@pytest.mark.parametrize(("argv", "words"), [
    (["--weights", "1"], "--weights: two numbers"),
    (["--weights", "1,0"], "must be positive"),
    (["--b-rate", "0"], "must be positive"),
])  # fmt: skip
def test_bad_flags_are_named(argv: list[str], words: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        arguments(argv)
    assert words in capsys.readouterr().err


def test_slot_time_is_counted_inside_the_phase_only() -> None:
    tally = Tally(runs=[(10.0, 4.0), (15.0, 1.0), (25.0, 10.0)])
    assert tally.slot_s(8.0, 20.0) == pytest.approx(2.0 + 1.0 + 5.0)


def test_a_short_run_reports_every_phase(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.fairness", "--phase-s", "1.5", "--flood", "2",
         "--b-rate", "5", "--b-batch", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    phases = report["phases"]
    assert list(phases) == ["B alone", "B beside A", "both flood"]
    assert phases["B alone"]["B"]["requests"] >= 5 and phases["B alone"]["A"]["count"] == 0
    for name in ("B beside A", "both flood"):
        assert phases[name]["A"]["failed"] == phases[name]["B"]["failed"] == 0
        assert phases[name]["A"]["served_slot_s"] > 0 and phases[name]["B"]["served_slot_s"] > 0
    assert any("slot share" in line for line in report["verdict"])
