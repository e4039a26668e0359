"""``python -m loadtests.faults`` end to end, short: every kind of fault once, under load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_short_soak_with_every_fault_accounts_for_every_request(tmp_path: Path) -> None:
    out = tmp_path / "faults"
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.faults", "--duration", "20", "--interval", "2",
         "--workload", "trivial", "--concurrency", "32", "--batch", "4", "--set", "preload=math",
         "--set", "warmup=", "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "report.json").read_text())
    assert {f["kind"] for f in data["after"]["faults"]} == {"zygote", "worker", "api", "redis"}
    assert all(data["checks"].values()), data["checks"]
    fig = data["figures"]
    assert fig["answered"] == fig["sent"] > 0 and fig["lost"] == fig["wrong"] == 0
    assert (out / "faults.png").read_bytes()[:4] == b"\x89PNG"
    assert "| every request answered (0 lost) | yes |" in (out / "summary.md").read_text()
