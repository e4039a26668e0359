"""Schemathesis against the service's own OpenAPI document: every operation, bounded.

Run by hand with more examples: ``schemathesis run URL/openapi.json --checks all -n 500``.

No 5xx, every response documented and matching its schema (so every 4xx carries a JSON error
body), schema-valid requests accepted and schema-violating ones refused: the published schema
carries this server's limits.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service.service_process import ServiceProcess

SCHEMATHESIS = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")


@pytest.mark.skipif(not Path(SCHEMATHESIS).exists(), reason="schemathesis is not installed")
def test_openapi_fuzzing(tight_service: ServiceProcess, tmp_path: Path) -> None:
    # Oversized code, stdin or files are refused with 413 (the contract), not 400/422.
    (tmp_path / "schemathesis.toml").write_text(
        "[checks.negative_data_rejection]\n"
        'expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", '
        '"422", "428", "429"]\n'
    )
    done = subprocess.run(
        [
            SCHEMATHESIS, "run", f"{tight_service.url}/openapi.json",
            "--checks", "all",
            "--max-examples", "30",
            "--seed", "7",
            "--generation-database", "none",
            "--request-timeout", "30",
            "--no-color",
        ],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
