"""The floor: plain processes forking a child per execution, driven as one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from loadtests.floor import Floor, FloorError, environment

TRIVIAL = ("print(sum(range(1000)))", "499500\n")


@pytest.fixture
def light() -> Iterator[Floor]:
    floor = Floor(2, None)
    floor.start()
    yield floor
    floor.stop()


def test_floor_light_is_a_bare_interpreter(light: Floor) -> None:
    code = "import sys; print(' '.join(sys.modules))"
    bare = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True,
                          text=True, check=True).stdout.split()  # fmt: skip
    for ready in light.ready:
        # Beyond what `python -c` holds: only what `-m` needs to find and run the module.
        assert set(ready["modules"]) - set(bare) <= {"runpy", "loadtests", "gc"}
        assert "huge_pages_mb" not in ready  # nothing prepared


def test_executions_are_shared_and_checked(light: Floor) -> None:
    assert light.prepare(*TRIVIAL) == 2
    run = light.go(60)
    assert (len(run.latencies), run.wrong, run.example) == (60, 0, "")
    assert run.seconds >= max(run.latencies) > 0
    assert light.prepare(*TRIVIAL, active=1) == 1  # one process alone: the idle latency
    assert len(light.go(7).latencies) == 7
    light.prepare("print(1)", "2\n")
    assert light.go(3).wrong == 3


def test_a_failing_program_is_wrong_with_its_traceback(light: Floor) -> None:
    light.prepare("1/0", "")
    run = light.go(2)
    assert run.wrong == 2 and "ZeroDivisionError" in run.example


def test_preloads_are_imported_as_the_zygote_does() -> None:
    floor = Floor(1, ["fractions"], "import fractions\nfractions.Fraction(1, 3)")
    floor.start()
    try:
        [ready] = floor.ready
        assert "fractions" in ready["modules"] and ready["preload_failed"] == []
        assert ready["huge_pages_mb"] >= 0
        floor.prepare("import fractions\nprint(fractions.Fraction(2, 4))", "1/2\n")
        assert floor.go(5).wrong == 0
    finally:
        pids = floor.pids
        floor.stop()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_a_preload_that_fails_stops_the_floor() -> None:
    with pytest.raises(FloorError, match="no_such_module_here"):
        Floor(1, ["no_such_module_here"]).start()
