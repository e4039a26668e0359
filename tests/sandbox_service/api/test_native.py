"""The native contract over real HTTP: results, backpressure, deadlines, idempotency, probes."""

from __future__ import annotations

import concurrent.futures
import uuid

import httpx

from sandbox_service.models import BatchResponse, ExecuteResult, Status, StatusReport
from sandbox_service.service_process import ServiceProcess
from tests.helpers import wait_until_admitted


def test_single_and_batch(tight_service: ServiceProcess) -> None:
    r = httpx.post(f"{tight_service.url}/v1/execute", json={"code": "print(2 + 2)"})
    result = ExecuteResult.model_validate(r.json())
    assert r.status_code == 200 and result.status is Status.ok and result.stdout == "4\n"
    batch = {"requests": [{"code": f"print({i})"} for i in range(3)]}
    r = httpx.post(f"{tight_service.url}/v1/execute/batch", json=batch)
    results = BatchResponse.model_validate(r.json()).results
    assert [x.stdout for x in results] == ["0\n", "1\n", "2\n"]


def test_curl_style_form_content_type_is_accepted(tight_service: ServiceProcess) -> None:
    r = httpx.post(
        f"{tight_service.url}/v1/execute",
        content=b'{"code": "print(5)"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.json()["stdout"] == "5\n"


def test_queue_full_answers_429_with_retry_after(tight_service: ServiceProcess) -> None:
    slow = {"requests": [{"code": "import time; time.sleep(1.5)", "timeout_s": 5}] * 3}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            httpx.post, f"{tight_service.url}/v1/execute/batch", json=slow, timeout=30
        )
        wait_until_admitted(tight_service.url, 3)
        r = httpx.post(f"{tight_service.url}/v1/execute", json={"code": "print(1)"})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert "queue is full" in r.json()["detail"]
        statuses = [x["status"] for x in running.result().json()["results"]]
    # one slot, 0.5 s queue-wait budget: the first runs, the others waited too long
    assert statuses == ["ok", "queue_timeout", "queue_timeout"]
    metrics = httpx.get(f"{tight_service.url}/metrics").text
    assert 'sandbox_http_refused_total{code="429"}' in metrics


def test_queue_timeout_is_explicit(tight_service: ServiceProcess) -> None:
    batch = {"requests": [{"code": "import time; time.sleep(1)"}, {"code": "print('late')"}]}
    r = httpx.post(f"{tight_service.url}/v1/execute/batch", json=batch, timeout=30)
    first, second = r.json()["results"]
    assert first["status"] == "ok"
    assert second["status"] == "queue_timeout" and second["stdout"] == ""
    assert "not started within 0.5 s" in second["message"]


def test_idempotent_resubmission(tight_service: ServiceProcess) -> None:
    key = f"req-{uuid.uuid4()}"
    body = {"code": "import random; print(random.random())", "id": key}
    first = httpx.post(f"{tight_service.url}/v1/execute", json=body).json()
    second = httpx.post(f"{tight_service.url}/v1/execute", json=body).json()
    assert first["id"] == key and first["stdout"] == second["stdout"]
    other = httpx.post(f"{tight_service.url}/v1/execute", json={**body, "id": key + "-b"}).json()
    assert other["stdout"] != first["stdout"]


def test_probes_status_and_metrics(tight_service: ServiceProcess) -> None:
    assert httpx.get(f"{tight_service.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{tight_service.url}/readyz").json() == {"status": "ready"}
    report = StatusReport.model_validate(httpx.get(f"{tight_service.url}/v1/status").json())
    assert report.mode == "embedded" and len(report.slots) == 1
    assert report.limits["max_batch"] == 4 and report.limits["max_timeout_s"] == 5
    assert report.executions.get("ok", 0) >= 1
    metrics = httpx.get(f"{tight_service.url}/metrics").text
    for name in (
        "sandbox_queue_depth",
        "sandbox_in_flight",
        "sandbox_executions_total",
        "sandbox_queue_wait_seconds_bucket",
        "sandbox_run_seconds_bucket",
    ):
        assert name in metrics


def test_openapi_documents_the_contract(tight_service: ServiceProcess) -> None:
    spec = httpx.get(f"{tight_service.url}/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert {"ExecuteRequest", "ExecuteResult", "BatchRequest", "BatchResponse"} <= set(schemas)
    assert set(schemas["ExecuteRequest"]["properties"]) == {
        "code", "stdin", "language", "timeout_s", "memory_mb", "mode", "files", "id", "session_id",
    }  # fmt: skip
    body = spec["paths"]["/v1/execute/batch"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/BatchRequest")
