"""The client's own logic, on httpx's MockTransport: batching, order, retries, errors."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sandbox_service.client import (
    AsyncSandboxClient,
    Retry,
    SandboxClient,
    SandboxOverloaded,
    SandboxRequestError,
    SandboxUnavailable,
)
from sandbox_service.models import ExecuteRequest, Status

FAST = Retry(attempts=4, backoff_s=0.001, max_backoff_s=0.01)


def _ok(request: dict) -> dict:
    return {"status": "ok", "stdout": request["code"], "id": request.get("id")}


def _run(handler, *calls, **options):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async with AsyncSandboxClient(
            "http://sandbox", transport=httpx.MockTransport(handler), retry=FAST, **options
        ) as client:
            return [await call(client) for call in calls]

    return asyncio.run(main())


def test_splits_into_batches_and_keeps_order() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sizes.append(len(body["requests"]))
        return httpx.Response(200, json={"results": [_ok(r) for r in body["requests"]]})

    [results] = _run(handler, lambda c: c.execute_batch([str(i) for i in range(25)]), batch_size=10)
    assert [r.stdout for r in results] == [str(i) for i in range(25)]
    assert sorted(sizes) == [5, 10, 10]


def test_discovers_server_batch_size() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/status":
            return httpx.Response(200, json={"mode": "embedded", "queue_depth": 0, "in_flight": 0,
                                             "workers": [], "limits": {"max_batch": 7}})  # fmt: skip
        body = json.loads(request.content)
        sizes.append(len(body["requests"]))
        return httpx.Response(200, json={"results": [_ok(r) for r in body["requests"]]})

    _run(handler, lambda c: c.execute_batch(["1"] * 15))
    assert sorted(sizes) == [1, 7, 7]


def test_retries_429_honouring_retry_after_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(429, json={"detail": "full"}, headers={"Retry-After": "0"})
        return httpx.Response(
            200, json={"results": [_ok(r) for r in json.loads(request.content)["requests"]]}
        )

    [result] = _run(handler, lambda c: c.execute("print(1)"), batch_size=8)
    assert result.stdout == "print(1)" and len(calls) == 3


def test_gives_up_with_typed_errors() -> None:
    def full(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"detail": "full"}, headers={"Retry-After": "0"})

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def bad(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422, json={"detail": [{"loc": ["body", "code"], "msg": "missing", "type": "x"}]}
        )

    with pytest.raises(SandboxOverloaded):
        _run(full, lambda c: c.execute("1"), batch_size=8)
    with pytest.raises(SandboxUnavailable) as info:
        _run(down, lambda c: c.execute("1"), batch_size=8)
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    with pytest.raises(SandboxRequestError) as bad_info:
        _run(bad, lambda c: c.execute("1"), batch_size=8)
    assert bad_info.value.status_code == 422 and bad_info.value.detail[0]["loc"] == ["body", "code"]


def test_rejected_items_are_sent_again() -> None:
    seen: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        reqs = json.loads(request.content)["requests"]
        seen.append([r["code"] for r in reqs])
        first = len(seen) == 1
        results = [
            {"status": "rejected", "message": "shutting down"}
            if first and r["code"] == "b"
            else _ok(r)
            for r in reqs
        ]
        return httpx.Response(200, json={"results": results})

    [results] = _run(handler, lambda c: c.execute_batch(["a", "b", "c"]), batch_size=8)
    assert [r.status for r in results] == [Status.ok] * 3
    assert [r.stdout for r in results] == ["a", "b", "c"]
    assert seen == [["a", "b", "c"], ["b"]]


def test_sync_client_against_real_service(client: SandboxClient) -> None:
    result = client.execute(ExecuteRequest(code="print(6 * 7)"))
    assert result.stdout == "42\n"
    assert client.execute("1/0").status is Status.error
    assert client.ready()


def test_sync_client_works_inside_a_running_event_loop(client: SandboxClient) -> None:
    async def inside() -> str:
        return client.execute("print('nested')").stdout

    assert asyncio.run(inside()) == "nested\n"
