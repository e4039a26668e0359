"""The SandboxFusion side-by-side's own logic; its client against this service only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loadtests import bench_sandboxfusion as bench
from loadtests.bench_sandboxfusion import Run
from loadtests.bench_stragglers import finish, spinning
from sandbox_service.service_process import ServiceProcess


def test_outcome_reads_sandboxfusion_answers() -> None:
    finished = {"status": "Success", "run_result": {"status": "Finished", "stdout": "3\n"}}
    failed = {"status": "Failed", "run_result": {"status": "Finished", "stdout": ""}}
    hung = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "x"}}
    broken = {"status": "SandboxError", "message": "no", "run_result": None}
    assert bench.outcome(finished) == ("ok", "3\n")
    assert bench.outcome(failed) == ("error", "")
    assert bench.outcome(hung) == ("timeout", "x")
    assert bench.outcome(broken) == ("sandbox_error", None)


def test_correct_needs_the_sum_and_the_timeout() -> None:
    item = bench.short_batch(1)[0]
    good = {"status": "Success", "run_result": {"status": "Finished", "stdout": item.stdout}}
    wrong = {"status": "Success", "run_result": {"status": "Finished", "stdout": "0\n"}}
    assert bench.correct(item, good) and not bench.correct(item, wrong)
    hung = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": ""}}
    assert bench.correct(spinning(1.0), hung) and not bench.correct(spinning(1.0), good)


def test_batches_have_issue_31s_shape() -> None:
    work = bench.batches(40)
    assert [len(work[name]) for name in ("hung", "short", "short+hung")] == [16, 40, 52]
    bodies = [bench.run_code_body(item) for item in work["short+hung"]]
    timeouts = sorted(body["run_timeout"] for body in bodies)
    assert timeouts == [2.0] * 12 + [bench.SHORT_TIMEOUT_S] * 40
    assert all(body["language"] == "python" for body in bodies)
    assert {bench.run_code_body(item)["run_timeout"] for item in work["hung"]} == {1.0}


def test_the_p99_it_reports_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 0.99) == 99.0
    assert bench.percentile(values[:16], 0.99) == 16.0
    assert bench.percentile([5.0], 0.50) == 5.0


def test_report_takes_the_ideal_from_the_same_system_and_round() -> None:
    runs = [Run("a", "short", 1, 400, 0.5, 0.1, 0), Run("a", "short+hung", 1, 412, 5.0, 2.1, 0),
            Run("b", "short", 1, 400, 2.0, 0.1, 0), Run("b", "short+hung", 1, 412, 4.0, 2.1, 1),
            Run("a", "short", 2, 400, 1.0, 0.1, 0)]  # fmt: skip
    rows = {(row["system"], row["batch"], row["round"]): row for row in bench.report(runs)}
    assert rows[("a", "short+hung", 1)]["ideal_s"] == 2.5
    assert rows[("a", "short+hung", 1)]["vs_ideal"] == 2.0
    assert rows[("b", "short+hung", 1)]["vs_ideal"] == 1.0
    assert "ideal_s" not in rows[("a", "short", 1)]
    text = bench.table(bench.report(runs))
    assert len(text.splitlines()) == 6 and "2.5" in text


def test_finish_writes_the_rows_and_fails_on_a_wrong_answer(tmp_path: Path) -> None:
    rows = [{"batch": "short", "wrong": 0}, {"batch": "hung", "wrong": 2}]
    assert finish(rows, str(tmp_path / "rows.json")) == 1
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    assert finish(rows[:1], None) == 0


def test_client_against_this_service(own_service: ServiceProcess) -> None:
    items = [*bench.short_batch(6), spinning(1.0)]
    wall, latencies, wrong = asyncio.run(bench.send(own_service.url, items, concurrency=4))
    assert wrong == 0 and len(latencies) == 7
    assert max(latencies) >= 1.0 and wall >= max(latencies)
