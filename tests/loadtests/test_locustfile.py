"""The Locust file runs headless against a real service and reports no failures."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service.service_process import ServiceProcess

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="locust is not installed (extra: loadtest)"
)
LOCUSTFILE = Path(__file__).parents[2] / "loadtests" / "locustfile.py"


def test_locust_headless_run(own_service: ServiceProcess, tmp_path: Path) -> None:
    # A process of its own: Locust monkey-patches the standard library with gevent on import.
    env = {**os.environ, "LOADTEST_WORKLOAD": "mixed", "LOADTEST_BATCH": "4", "LOADTEST_SEED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", own_service.url,
         "--headless", "--users", "4", "--spawn-rate", "4", "--run-time", "4s",
         "--only-summary", "--csv", str(tmp_path / "stats"), "--exit-code-on-error", "1"],
        capture_output=True, text=True, timeout=90, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with open(tmp_path / "stats_stats.csv") as f:
        total = next(row for row in csv.DictReader(f) if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0
