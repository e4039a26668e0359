"""A response is bounded in bytes as sent (output that JSON-escapes to six bytes a byte
included), one request's and one batch's; and every front reports a run stopped by a limit
as stopped, never as success, whatever exit code the program returned first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbox_service.service_process import ServiceProcess, launch

CAP = 4096  # max_output_bytes
STREAM_BOUND = 2 * CAP  # escaped bytes of one stream as sent
BATCH_MIB = 1


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("bounds") / "service.log"
    with launch(
        str(log),
        slots=2,
        preload="",
        max_output_bytes=CAP,
        max_response_mb=BATCH_MIB,
        max_batch=200,
        codejudge_max_output_chars=0,  # code-judge's results keep all their output
    ) as svc:
        yield svc


def _writes(out: bytes, err: bytes = b"") -> str:
    return f"import os; os.write(1, {out!r}); os.write(2, {err!r})"


@pytest.mark.parametrize(
    "code",
    [
        _writes(b"\x01" * CAP),
        _writes(b"", b"\x1f" * CAP),
        _writes(b"\x00\x01" * (CAP // 2), b"\x02\x7f" * (CAP // 2)),
        _writes(b"\x01" * (CAP + 1)),  # over the cap too: output_limit and trimmed
    ],
    ids=["stdout", "stderr", "both", "over the cap"],
)
def test_one_response_is_bounded(bounded: ServiceProcess, code: str) -> None:
    response = httpx.post(bounded.url + "/v1/execute", json={"code": code}, timeout=60)
    result = response.json()
    assert len(response.content) <= 2 * STREAM_BOUND + 2048, len(response.content)
    for name in ("stdout", "stderr"):
        if result[name]:
            assert result[f"{name}_truncated"], result["message"]
    assert "trimmed" in result["message"]


def test_text_at_the_cap_passes_whole(bounded: ServiceProcess) -> None:
    text = ("é\tline\n" * CAP)[: CAP // 2]  # UTF-8 and escapes of two bytes: within the bound
    code = f"import sys; sys.stdout.write({text!r})"
    result = httpx.post(bounded.url + "/v1/execute", json={"code": code}, timeout=60).json()
    assert result["status"] == "ok" and result["stdout"] == text
    assert not result["stdout_truncated"]


def test_sandboxfusion_response_is_bounded(bounded: ServiceProcess) -> None:
    body = {"code": _writes(b"\x01" * CAP, b"\x01" * CAP), "language": "python"}
    response = httpx.post(bounded.url + "/run_code", json=body, timeout=60)
    assert len(response.content) <= 2 * STREAM_BOUND + 2048, len(response.content)


@pytest.mark.parametrize("cells", [1, 3])
def test_jupyter_response_is_bounded(bounded: ServiceProcess, cells: int) -> None:
    cell = f"import sys; sys.stdout.write('\\x01' * {CAP // (2 * cells)}); sys.stdout.flush()"
    body = {"cells": [cell] * cells}
    response = httpx.post(bounded.url + "/run_jupyter", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.content) <= 2 * STREAM_BOUND + 4096, len(response.content)
    sent = [c["stdout"] for c in response.json()["cells"]]
    assert len(sent) == cells and all(s.startswith("\x01") for s in sent)
    assert sum(len(json.dumps(s)) - 2 for s in sent) <= STREAM_BOUND  # the cells together


@pytest.mark.parametrize("path", ["/run", "/run/batch"])
def test_codejudge_response_is_bounded(bounded: ServiceProcess, path: str) -> None:
    sub = {"type": "python", "solution": _writes(b"\x01" * CAP, b"\x01" * CAP)}
    body: dict[str, Any] = sub if path == "/run" else {"submissions": [sub, sub]}
    response = httpx.post(bounded.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.content) <= 2 * (2 * STREAM_BOUND + 2048), len(response.content)


def test_one_batch_is_bounded(bounded: ServiceProcess) -> None:
    count = 150  # 150 x 2 streams x 24 KiB escaped: 7 MiB unbounded
    requests = [{"code": _writes(b"\x01" * CAP, b"\x01" * CAP)} for _ in range(count)]
    response = httpx.post(
        bounded.url + "/v1/execute/batch", json={"requests": requests}, timeout=300
    )
    results: list[dict[str, Any]] = response.json()["results"]
    assert len(results) == count
    assert len(response.content) <= BATCH_MIB * 2**20 + count * 512, len(response.content)
    assert all(r["stdout_truncated"] and r["stderr_truncated"] for r in results)


RACES = {
    "cap, pause, one more byte": "import sys, time\nsys.stdout.write('x' * {cap})\n"
    "sys.stdout.flush()\ntime.sleep(0.2)\nsys.stdout.write('y')\nsys.stdout.flush()",
    "over the cap at once": "import os\nos.write(1, b'x' * ({cap} + 1))",
    "stderr over the cap": "import os, time\nos.write(2, b'e' * {cap})\ntime.sleep(0.2)\n"
    "os.write(2, b'e')",
}


@pytest.mark.parametrize("race", list(RACES), ids=list(RACES))
def test_stopped_runs_are_never_success(bounded: ServiceProcess, race: str) -> None:
    code = RACES[race].format(cap=CAP)
    for _ in range(4):
        native = httpx.post(bounded.url + "/v1/execute", json={"code": code}, timeout=60).json()
        assert native["status"] == "output_limit", native
        body = {"code": code, "language": "python"}
        fusion = httpx.post(bounded.url + "/run_code", json=body, timeout=60).json()
        assert fusion["status"] == "Failed", fusion
        assert fusion["run_result"]["return_code"] != 0, fusion
        assert "output" in fusion["message"], fusion
        sub = {"type": "python", "solution": code, "expected_output": ""}
        judged = httpx.post(bounded.url + "/run", json=sub, timeout=60).json()
        assert not judged["success"] and not judged["run_success"], judged
