"""Clients for the native API: ``AsyncSandboxClient`` (the core) and ``SandboxClient`` (blocking).

    async with AsyncSandboxClient("http://127.0.0.1:8000") as sandbox:
        results = await sandbox.execute_batch(["print(1)", "print(2)"])

A large batch is split into server-sized chunks sent concurrently, and the results come back
in request order. ``api_key=`` (or ``SANDBOX_API_KEY`` in the environment) is sent as
``Authorization: Bearer KEY`` to a service with auth on. 429 and 503 are retried with backoff
that honours Retry-After, and so are results with status ``rejected`` (they never ran, so
running them again is safe). The
blocking client runs the async one on a private event loop, so there is one implementation.

Errors (all raised from the httpx error that caused them, where there is one)::

    SandboxError
     ├── SandboxUnavailable    cannot connect, no answer in time, or 503 after every retry
     ├── SandboxOverloaded     429 after every retry
     ├── SandboxRequestError   the server refused the request (4xx); ``.detail`` says why
     │    └── SandboxAuthError 401 (no valid API key) or 403 (the key may not do that)
     └── SandboxProtocolError  an answer that is not what the contract says
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from sandbox_service.models import (
    BatchRequest,
    BatchResponse,
    ExecuteRequest,
    ExecuteResult,
    Status,
    StatusReport,
)

T = TypeVar("T")
RequestLike = ExecuteRequest | str | dict[str, Any]

DEFAULT_URL = "http://127.0.0.1:8000"
# Reads wait for executions that may queue for minutes under load; connects should be quick.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=900.0, write=60.0, pool=None)
FALLBACK_BATCH = 256


class SandboxError(Exception):
    """Base of every error this client raises."""


class SandboxUnavailable(SandboxError):
    pass


class SandboxOverloaded(SandboxError):
    pass


class SandboxRequestError(SandboxError):
    def __init__(self, status_code: int, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"HTTP {status_code}: {detail}")


class SandboxAuthError(SandboxRequestError):
    pass


class SandboxProtocolError(SandboxError):
    pass


@dataclass(frozen=True)
class Retry:
    """How hard to try: attempts per HTTP request, and exponential backoff with jitter."""

    attempts: int = 8
    backoff_s: float = 0.25
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after is not None:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        base = min(self.backoff_s * 2.0**attempt, self.max_backoff_s)
        return base * (0.5 + random.random() / 2)


def as_request(item: RequestLike) -> ExecuteRequest:
    if isinstance(item, ExecuteRequest):
        return item
    if isinstance(item, str):
        return ExecuteRequest(code=item)
    return ExecuteRequest.model_validate(item)


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except ValueError:
        return response.text


class AsyncSandboxClient:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
        batch_size: int | None = None,
        concurrency: int = 16,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.retry = retry or Retry()
        key = api_key if api_key is not None else os.environ.get("SANDBOX_API_KEY", "")
        if key:
            headers = {**(headers or {}), "Authorization": f"Bearer {key}"}
        self.batch_size = batch_size
        self.concurrency = concurrency
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers=headers,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------- public

    async def execute(self, request: RequestLike, **fields: Any) -> ExecuteResult:
        """Run one program: an ExecuteRequest, a dict of its fields, or code plus ``fields``."""
        req = as_request(request)
        if fields:  # validated, so that mode="repl" is the enum and bad values fail here
            req = ExecuteRequest.model_validate({**req.model_dump(exclude_unset=True), **fields})
        [result] = await self.execute_batch([req])
        return result

    async def execute_batch(self, requests: Sequence[RequestLike]) -> list[ExecuteResult]:
        """Run every request; results in the same order."""
        reqs = [as_request(r) for r in requests]
        if not reqs:
            return []
        size = self.batch_size or await self._server_batch_size()
        chunks = [reqs[i : i + size] for i in range(0, len(reqs), size)]
        gate = asyncio.Semaphore(self.concurrency)

        async def run(chunk: list[ExecuteRequest]) -> list[ExecuteResult]:
            async with gate:
                return await self._run_chunk(chunk)

        done = await asyncio.gather(*(run(c) for c in chunks))
        return [result for chunk in done for result in chunk]

    async def status(self) -> StatusReport:
        response = await self._send("GET", "/v1/status")
        return self._parse(StatusReport, response)

    async def ready(self) -> bool:
        try:
            response = await self._http.get("/readyz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    # ------------------------------------------------------------- layers

    async def _server_batch_size(self) -> int:
        try:
            limit = int((await self.status()).limits.get("max_batch", FALLBACK_BATCH))
        except SandboxError:
            limit = FALLBACK_BATCH
        self.batch_size = max(1, min(limit, FALLBACK_BATCH))
        return self.batch_size

    async def _run_chunk(self, chunk: list[ExecuteRequest]) -> list[ExecuteResult]:
        """One batch request; items answered ``rejected`` (never ran) are sent again."""
        results: list[ExecuteResult | None] = [None] * len(chunk)
        todo = list(range(len(chunk)))
        for attempt in range(self.retry.attempts):
            body = BatchRequest(requests=[chunk[i] for i in todo]).model_dump_json(
                exclude_defaults=True
            )
            response = await self._send("POST", "/v1/execute/batch", content=body)
            answered = self._parse(BatchResponse, response).results
            if len(answered) != len(todo):
                raise SandboxProtocolError(
                    f"sent {len(todo)} requests, got {len(answered)} results"
                )
            again = []
            for index, result in zip(todo, answered, strict=True):
                results[index] = result
                if result.status is Status.rejected:
                    again.append(index)
            if not again or attempt + 1 == self.retry.attempts:
                break
            todo = again
            await asyncio.sleep(self.retry.delay(attempt))
        return [r for r in results if r is not None]

    async def _send(self, method: str, path: str, content: str | None = None) -> httpx.Response:
        """One HTTP exchange, retried on connection failure, 429 and 503."""
        headers = {"content-type": "application/json"} if content is not None else None
        last: SandboxError = SandboxUnavailable(f"no attempt made to reach {path}")
        for attempt in range(self.retry.attempts):
            try:
                response = await self._http.request(method, path, content=content, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                last = SandboxUnavailable(f"cannot reach {self._http.base_url}: {exc!r}")
                last.__cause__ = exc
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            except httpx.TimeoutException as exc:
                raise SandboxUnavailable(f"no answer from {path} in time: {exc!r}") from exc
            except httpx.HTTPError as exc:
                raise SandboxUnavailable(f"{method} {path} failed: {exc!r}") from exc
            code = response.status_code
            if code in (429, 503):
                kind = SandboxOverloaded if code == 429 else SandboxUnavailable
                last = kind(f"HTTP {code} after {attempt + 1} attempts: {_detail(response)}")
                await asyncio.sleep(self.retry.delay(attempt, response.headers.get("retry-after")))
                continue
            if code in (401, 403):
                raise SandboxAuthError(code, _detail(response))
            if 400 <= code < 500:
                raise SandboxRequestError(code, _detail(response))
            if code >= 500:
                raise SandboxError(f"HTTP {code} from {path}: {_detail(response)}")
            return response
        raise last

    @staticmethod
    def _parse(model: type[T], response: httpx.Response) -> T:
        try:
            return model.model_validate_json(response.content)  # type: ignore[attr-defined,no-any-return]
        except ValidationError as exc:
            raise SandboxProtocolError(f"unexpected answer: {exc}") from exc


class SandboxClient:
    """Blocking client with the same methods, driving an AsyncSandboxClient on its own loop
    (so it also works where an event loop is already running, as in a notebook)."""

    def __init__(self, base_url: str = DEFAULT_URL, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._async = self._call(self._make(base_url, options))

    @staticmethod
    async def _make(base_url: str, options: dict[str, Any]) -> AsyncSandboxClient:
        return AsyncSandboxClient(base_url, **options)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def execute(self, request: RequestLike, **fields: Any) -> ExecuteResult:
        return self._call(self._async.execute(request, **fields))

    def execute_batch(self, requests: Sequence[RequestLike]) -> list[ExecuteResult]:
        return self._call(self._async.execute_batch(requests))

    def status(self) -> StatusReport:
        return self._call(self._async.status())

    def ready(self) -> bool:
        return self._call(self._async.ready())

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self._async.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
