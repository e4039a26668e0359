"""The fork-cost benchmark runs every variant and prints a figure for each."""

from __future__ import annotations

import pytest

from loadtests import fork_cost


def test_prints_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert fork_cost.main(["--n", "20", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    figures = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines}
    assert set(figures) == set(fork_cost.VARIANTS)
    assert all(wall > 0 and cpu >= 0 for wall, cpu in figures.values())
