"""POST /v1/verify: math answers checked in the sandbox, bounded in time, in order."""

from __future__ import annotations

import time
from typing import Any

import httpx

from sandbox_service.service_process import ServiceProcess


def _verify(service: ServiceProcess, items: list[dict], **extra: object) -> list[dict]:
    r = httpx.post(f"{service.url}/v1/verify", json={"items": items, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_equal_forms_wrong_answers_and_missing_boxes(service: ServiceProcess) -> None:
    items: list[dict[str, Any]] = [
        {"response": "so \\boxed{\\frac{1}{2}}", "reference": "0.5"},
        {"response": "\\boxed{2\\sqrt{2}}", "reference": "\\sqrt{8}"},
        {"response": "\\boxed{13}", "reference": "12"},
        {"response": "no box here, just 12", "reference": "12"},
        {
            "response": "\\boxed{12} <answer>\\boxed{11}</answer>",
            "reference": "12",
            "require_answer_tag": True,
        },
        {"response": "<answer>\\boxed{12}</answer>", "reference": "12", "require_answer_tag": True},
    ]
    results = _verify(service, items)
    assert [r["correct"] for r in results] == [True, True, False, False, False, True]
    assert results[0]["parsed_prediction"] and results[0]["parsed_reference"]
    assert results[2]["error"] is None and results[2]["prediction"] == "13"
    assert "no \\boxed{}" in results[3]["error"]


def test_pathological_expression_times_out_instead_of_hanging(service: ServiceProcess) -> None:
    items = [
        {"response": "\\boxed{9^{9^{9^{9}}}}", "reference": "1"},
        {"response": "\\boxed{7}", "reference": "7"},
    ]
    start = time.monotonic()
    results = _verify(service, items, timeout_s=1)
    assert time.monotonic() - start < 60
    assert results[0]["correct"] is False and "imeout" in results[0]["error"]
    assert results[1]["correct"] is True  # the next item of the same chunk still got its verdict


def test_many_items_keep_their_order(service: ServiceProcess) -> None:
    items = [
        {"response": f"\\boxed{{{i}}}", "reference": str(i if i % 3 else i + 1)} for i in range(40)
    ]
    results = _verify(service, items)
    assert [r["correct"] for r in results] == [bool(i % 3) for i in range(40)]


def test_bad_input(service: ServiceProcess) -> None:
    r = httpx.post(f"{service.url}/v1/verify", json={"items": []})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", "items"]
    r = httpx.post(f"{service.url}/v1/verify", json={"items": [{"response": "x"}]})
    assert r.status_code == 422 and ["body", "items", 0, "reference"] in [
        d["loc"] for d in r.json()["detail"]
    ]
