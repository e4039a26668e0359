"""Error bodies and handlers: every refusal is JSON that names the field and the limit.

Validation problems keep FastAPI's own shape (``{"detail": [{"loc", "msg", "type", "ctx"}]}``)
so that clients that already understand FastAPI's 422 understand ours; refusals of a whole
request (429, 503, 413 for an oversized body; 401, 403 from ``api.auth``) carry
``{"detail": "why"}``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from sandbox_service.api.body_bounds import BodyTooComplex
from sandbox_service.models import ErrorDetail, RequestRejected
from sandbox_service.queue.base import ClientGone, QueueFull, QueueUnavailable, QuotaExceeded

log = logging.getLogger(__name__)


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body exceeds {limit} bytes")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def from_validation_error(
    exc: ValidationError, prefix: tuple[str, ...] = ("body",)
) -> RequestRejected:
    details = []
    for err in exc.errors(include_url=False):
        ctx = {k: _jsonable(v) for k, v in (err.get("ctx") or {}).items()} or None
        msg = err["msg"]
        if err["type"] == "json_invalid":
            msg = f"body is not valid JSON (UTF-8): {ctx.get('error') if ctx else msg}"
        details.append(ErrorDetail(loc=[*prefix, *err["loc"]], msg=msg, type=err["type"], ctx=ctx))
    return RequestRejected(422, details)


def _methods_for(request: Request) -> set[str]:
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.path_regex.match(request.url.path):
            methods |= route.methods or set()
    return methods


def _detail(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestRejected)
    async def _rejected(request: Request, exc: RequestRejected) -> JSONResponse:
        body = {"detail": [d.model_dump(exclude_none=True) for d in exc.details]}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return _detail(413, f"{exc}; split the batch or raise SANDBOX_MAX_BODY_MB")

    @app.exception_handler(BodyTooComplex)
    async def _too_complex(request: Request, exc: BodyTooComplex) -> JSONResponse:
        return _detail(413, f"{exc}; split the batch or raise SANDBOX_MAX_BODY_VALUES")

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> JSONResponse:
        metrics = request.app.state.runtime.metrics
        metrics.refused.labels("429").inc()
        if isinstance(exc, QuotaExceeded):
            metrics.tenant_refused.labels(metrics.label(exc.tenant), exc.quota).inc()
        return _detail(429, str(exc), {"Retry-After": str(exc.retry_after)})

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(QueueUnavailable)
    async def _unavailable(request: Request, exc: QueueUnavailable) -> JSONResponse:
        request.app.state.runtime.metrics.refused.labels("503").inc()
        retry = str(request.app.state.settings.retry_after_s)
        return _detail(503, str(exc), {"Retry-After": retry})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the first route on the path; there may be
            # several (GET and DELETE of a session, say).
            headers["Allow"] = ", ".join(sorted(_methods_for(request)))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _detail(500, f"internal error: {type(exc).__name__}: {exc}")
