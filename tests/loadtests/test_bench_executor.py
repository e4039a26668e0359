"""``python -m loadtests.bench_executor --quick``: every mode beside the floor, in one small run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.bench_executor import arguments
from sandbox_service.service_process import ServiceProcess

MODES = ("floor", "floor-light", "bare", "service", "naive", "service-cj", "codejudge")


def test_quick_run_measures_every_mode_beside_the_floor(
    own_service: ServiceProcess, tmp_path: Path
) -> None:
    # Our own code-judge front stands in for code-judge: the same API, so the same client.
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_executor", "--quick", "--json", str(out),
         "--codejudge-url", own_service.url],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    figs = {(f["mode"], f["workload"]): f for f in data["figures"]}
    for mode in MODES:
        for workload in ("trivial", "sympy", "numpy"):
            fig = figs[(mode, workload)]
            assert fig["n"] > 0 and fig["wrong"] == 0 and fig["exec_per_s"] > 0, fig
    for mode in ("service@1", "floor@1", "service@10", "codejudge@1"):
        assert figs[(mode, "trivial")]["p50_ms"] <= figs[(mode, "trivial")]["p99_ms"]
    assert figs[("service@10", "trivial")]["queue_p50_ms"] is not None
    # The executions' CPU is seen in every mode that forks them, and the service's API
    # process and zygotes apart from them.
    floor, service = figs[("floor", "trivial")]["cpu_ms"], figs[("service", "trivial")]["cpu_ms"]
    assert sum(floor["children"]) > 0 and "api" not in floor
    assert sum(service["children"]) > 0 and {"client", "api", "zygote"} <= set(service)
    assert sum(figs[("naive", "trivial")]["cpu_ms"]["children"]) > 0
    text = done.stdout
    for label in ("bare / floor", "service / floor", "service / floor-light"):
        # exec/s ratio and, in parentheses, the same by CPU, for each of the three workloads
        assert re.search(rf"^{label}( +\d+\.\d+ \(\d+\.\d+\)){{3}}$", text, re.M), label
    # (code-judge's few executions may take less CPU than a clock tick of /proc shows)
    assert re.search(r"^service / code-judge( +\d+\.\d+( \(\d+\.\d+\))?){3}$", text, re.M)
    assert "CPU per execution" in text and "latency of single requests" in text
    assert data["isolation"]["seccomp"] is True


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--modes", "floor,nope"], "unknown modes"),
        (["--modes", "codejudge"], "needs --codejudge-url"),
        (["--workloads", "trivial,other"], "--workloads"),
        (["--rounds", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        arguments(argv)
    assert why in capsys.readouterr().err


def test_modes_default_to_all_but_the_code_judge_pair() -> None:
    assert arguments([]).mode_list == ["floor", "floor-light", "bare", "service", "redis", "naive"]
    quick = arguments(["--quick", "--codejudge-url", "http://127.0.0.1:9"])
    assert "redis" not in quick.mode_list and {"service-cj", "codejudge"} <= set(quick.mode_list)
    assert arguments(["--modes", "floor"]).mode_list == ["floor", "service"]  # always service
