"""Every kind of bad input gets a 4xx JSON error naming the field and the limit, and the
service keeps serving."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from sandbox_service.service_process import ServiceProcess


def _post(
    service: ServiceProcess, path: str, body: Any, raw: bytes | None = None
) -> httpx.Response:
    if raw is not None:
        return httpx.post(service.url + path, content=raw, timeout=30)
    return httpx.post(service.url + path, json=body, timeout=30)


def _locs(response: httpx.Response) -> list[list[Any]]:
    detail = response.json()["detail"]
    assert isinstance(detail, list), detail
    for item in detail:
        assert item["msg"] and item["type"]
    return [item["loc"] for item in detail]


CASES = [
    ("missing code", "/v1/execute", {"stdin": "x"}, 422, ["body", "code"]),
    (
        "unknown language",
        "/v1/execute",
        {"code": "1", "language": "cobol"},
        422,
        ["body", "language"],
    ),
    ("timeout zero", "/v1/execute", {"code": "1", "timeout_s": 0}, 422, ["body", "timeout_s"]),
    ("timeout negative", "/v1/execute", {"code": "1", "timeout_s": -1}, 422, ["body", "timeout_s"]),
    ("timeout over max", "/v1/execute", {"code": "1", "timeout_s": 6}, 422, ["body", "timeout_s"]),
    ("memory zero", "/v1/execute", {"code": "1", "memory_mb": 0}, 422, ["body", "memory_mb"]),
    (
        "memory over max",
        "/v1/execute",
        {"code": "1", "memory_mb": 4096},
        422,
        ["body", "memory_mb"],
    ),
    ("bad mode", "/v1/execute", {"code": "1", "mode": "jupyter"}, 422, ["body", "mode"]),
    ("unknown field", "/v1/execute", {"code": "1", "tiemout_s": 3}, 422, ["body", "tiemout_s"]),
    ("code too big", "/v1/execute", {"code": "#" * 1001}, 413, ["body", "code"]),
    ("stdin too big", "/v1/execute", {"code": "1", "stdin": "x" * 1001}, 413, ["body", "stdin"]),
    (
        "files too big",
        "/v1/execute",
        {"code": "1", "files": {"a": base64.b64encode(b"x" * 1002).decode()}},
        413,
        ["body", "files"],
    ),
    (
        "absolute path",
        "/v1/execute",
        {"code": "1", "files": {"/etc/passwd": ""}},
        422,
        ["body", "files"],
    ),
    (
        "dotdot path",
        "/v1/execute",
        {"code": "1", "files": {"a/../../x": ""}},
        422,
        ["body", "files"],
    ),
    ("bad base64", "/v1/execute", {"code": "1", "files": {"a.txt": "!!!"}}, 422, ["body", "files"]),
    ("empty batch", "/v1/execute/batch", {"requests": []}, 422, ["body", "requests"]),
    (
        "batch over max",
        "/v1/execute/batch",
        {"requests": [{"code": "1"}] * 5},
        422,
        ["body", "requests"],
    ),
    (
        "bad item in batch",
        "/v1/execute/batch",
        {"requests": [{"code": "1"}, {"code": "1", "timeout_s": 60}]},
        422,
        ["body", "requests", 1, "timeout_s"],
    ),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "loc"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_request(tight_service: ServiceProcess, name: str, path: str, body: Any, status: int,
                     loc: list[Any]) -> None:  # fmt: skip
    response = _post(tight_service, path, body)
    assert response.status_code == status, response.text
    assert loc in _locs(response)


def test_limit_is_named(tight_service: ServiceProcess) -> None:
    response = _post(tight_service, "/v1/execute", {"code": "1", "timeout_s": 6})
    [detail] = response.json()["detail"]
    assert detail["ctx"]["limit"] == 5 and "5" in detail["msg"]


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"code": "print(1)"', b'{"code": "\xff\xfe"}', b"", b"[]"],
    ids=["invalid json", "truncated", "invalid utf-8", "empty body", "not an object"],
)
def test_unparseable_body(tight_service: ServiceProcess, raw: bytes) -> None:
    response = _post(tight_service, "/v1/execute", None, raw=raw)
    assert response.status_code == 422, response.text
    assert _locs(response)


def test_huge_body_is_refused(tight_service: ServiceProcess) -> None:
    response = _post(tight_service, "/v1/execute", None, raw=b"x" * (65 * 1024 * 1024))
    assert response.status_code == 413
    assert "exceeds" in response.json()["detail"]


def test_still_serving_after_bad_input(tight_service: ServiceProcess) -> None:
    for _, path, body, _, _ in CASES:
        _post(tight_service, path, body)
    response = _post(tight_service, "/v1/execute", {"code": "print('alive')"})
    assert response.status_code == 200, response.text
    assert response.json()["stdout"] == "alive\n"


def test_files_round_trip_under_limit(tight_service: ServiceProcess) -> None:
    files = {"in.txt": base64.b64encode(b"abc").decode()}
    response = _post(
        tight_service, "/v1/execute", {"code": "print(open('in.txt').read())", "files": files}
    )
    assert response.json()["stdout"] == "abc\n"
