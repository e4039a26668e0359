"""``create_app(settings)``: the FastAPI application, its routers, and the runtime's lifespan.

The runtime (embedded slots, or a Redis queue on an API node) is created by the caller or
here, and started and stopped by the lifespan, never at import time. With auth on
(``api_keys_file``) the key file is read here (a file that does not parse stops the start,
naming the line), the ``api.auth`` middleware goes in front of every route, and the lifespan
reloads the file when it changes and on SIGHUP.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import sandbox_service
from sandbox_service.api import codejudge, errors, grade, health, native, sandboxfusion, verify
from sandbox_service.api import sessions as session_routes
from sandbox_service.api.auth import Authenticate, anonymous_fronts
from sandbox_service.api.disconnect import Disconnects
from sandbox_service.api.errors import BodyTooLarge
from sandbox_service.metrics import CONTENT_TYPE
from sandbox_service.models import BatchRequest, ExecuteRequest
from sandbox_service.probe_server import serve_probes
from sandbox_service.runtime.base import Runtime
from sandbox_service.runtime.embedded import EmbeddedRuntime
from sandbox_service.session_replay import Sessions
from sandbox_service.settings import Settings
from sandbox_service.tenants import KeyStore

KEY_POLL_S = 2.0  # how often the key file is checked for changes

DESCRIPTION = """\
Runs untrusted Python fast and isolated, for agentic RL tool calls. Send one program to
`/v1/execute` or many to `/v1/execute/batch`; every request is answered with a result whose
`status` says how it ended (`ok`, `error`, `timeout`, `memory_limit`, `output_limit`,
`killed`) or why it did not run (`queue_timeout`, `rejected`, `internal_error`).
"""


class BodyLimit:
    """Refuse bodies over the limit before reading them whole (413)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                body = f'{{"detail": "request body exceeds {self.max_bytes} bytes"}}'.encode()
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


def _publish_limits(components: dict[str, Any], settings: Settings) -> None:
    """Write this server's maxima into the published schema, so that a client (or a fuzzer)
    following the document is not refused: maxLength counts characters, as the server does."""
    request = components["ExecuteRequest"]["properties"]
    request["timeout_s"]["maximum"] = settings.max_timeout_s
    request["memory_mb"]["maximum"] = settings.max_memory_mb
    request["code"]["maxLength"] = settings.max_code_chars
    request["stdin"]["maxLength"] = settings.max_stdin_chars
    request["files"]["description"] += f" At most {settings.max_files_bytes} bytes decoded."
    components["BatchRequest"]["properties"]["requests"]["maxItems"] = settings.max_batch
    if "BatchSubmission" in components:  # code-judge's batches: refused whole above max_batch
        components["BatchSubmission"]["properties"]["submissions"]["maxItems"] = settings.max_batch
    if "GradeRequest" in components:
        grade = components["GradeRequest"]["properties"]
        grade["timeout_s"]["maximum"] = settings.max_timeout_s
        grade["memory_mb"]["maximum"] = settings.max_memory_mb
        grade["code"]["maxLength"] = settings.max_code_chars
        components["GradeCase"]["properties"]["stdin"]["anyOf"][0]["maxLength"] = (
            settings.max_stdin_chars
        )
    if "VerifyRequest" in components:
        limit = min(settings.max_timeout_s, verify.MAX_ITEM_TIMEOUT_S)
        components["VerifyRequest"]["properties"]["timeout_s"]["maximum"] = limit


def _with_request_schemas(app: FastAPI, models: list[type[BaseModel]], settings: Settings) -> None:
    """Routes that parse their own bodies still publish the request schemas, with limits."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, definition in model_schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components[model.__name__] = model_schema
        _publish_limits(components, settings)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _watch_keys(store: KeyStore) -> None:
    while True:
        await asyncio.sleep(KEY_POLL_S)
        store.reload()


@contextlib.asynccontextmanager
async def _keys_kept_fresh(store: KeyStore | None, rt: Runtime) -> AsyncIterator[None]:
    """While the app runs: the key file reloaded on change and SIGHUP, and /metrics on its own
    port when ``metrics_port`` is set."""
    if store is None:
        yield
        return
    loop = asyncio.get_running_loop()
    watcher = asyncio.create_task(_watch_keys(store), name="api-keys")
    hup = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGHUP, store.reload, True)  # not off the main thread
        hup = True
    server = None
    if rt.settings.metrics_port:

        async def metrics() -> tuple[int, str, bytes]:
            return 200, CONTENT_TYPE, rt.metrics.render()

        server = await serve_probes(
            rt.settings.host, rt.settings.metrics_port, {"/metrics": metrics}
        )
    try:
        yield
    finally:
        watcher.cancel()
        if hup:
            loop.remove_signal_handler(signal.SIGHUP)
        if server is not None:
            server.close()


def _session_limit(store: KeyStore | None) -> Callable[[str], int] | None:
    """A tenant's ``max_sessions``, read from the key file as it is now."""
    if store is None:
        return None

    def limit(name: str) -> int:
        tenant = store.tenant(name)
        return tenant.max_sessions if tenant is not None else 0

    return limit


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    # The key file first: one that does not parse stops the start before any slot does.
    store = KeyStore.load(settings.api_keys_file) if settings.api_keys_file else None
    anonymous = (
        anonymous_fronts(
            settings, store, {"sandboxfusion": sandboxfusion.PATHS, "codejudge": codejudge.PATHS}
        )
        if store is not None
        else []
    )
    rt: Runtime = runtime if runtime is not None else EmbeddedRuntime(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await rt.start()
        try:
            async with _keys_kept_fresh(store, rt):
                yield
        finally:
            await rt.stop()

    app = FastAPI(
        title="sandbox-service",
        version=sandbox_service.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runtime = rt
    app.state.keys = store
    app.add_middleware(Disconnects)  # innermost: it owns receive once the body is read
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_mb * 1024 * 1024)
    if store is not None:  # outermost: nothing is read of a request that has no key
        app.add_middleware(
            Authenticate, store=store, settings=settings, metrics=rt.metrics, anonymous=anonymous
        )
    app.include_router(native.router)
    app.include_router(health.router)
    app.state.sessions = Sessions(settings, _session_limit(store))
    app.include_router(session_routes.router)
    app.include_router(sandboxfusion.router)
    app.include_router(codejudge.router)
    app.include_router(verify.router)
    app.include_router(grade.router)
    errors.install(app)
    _with_request_schemas(app, [
        ExecuteRequest, BatchRequest, sandboxfusion.RunCodeRequest,
        sandboxfusion.RunJupyterRequest, codejudge.Submission, codejudge.BatchSubmission,
        verify.VerifyRequest, grade.GradeRequest,
    ], settings)  # fmt: skip
    return app
