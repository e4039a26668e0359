"""Noticing a client that went away, and the one typed path from a route to the queue.

How: after a request's body is read, the ASGI server's ``receive`` has nothing more to give
until the connection closes, when it answers ``{"type": "http.disconnect"}`` (uvicorn sets
it when the transport is lost; Starlette's ``Request.is_disconnected`` polls the same
message). ``Disconnects`` waits for that message in a task of its own and sets the request's
``gone`` event, which every route hands the queue inside its ``Submission``: queued jobs
nobody else waits for are then dropped and running ones killed (``Queue.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_service.api.auth import tenant_of
from sandbox_service.models import ExecuteRequest
from sandbox_service.queue.base import Submission

GONE = "sandbox.gone"  # the scope key of a request's asyncio.Event


class Disconnects:
    """Sets ``scope[GONE]`` once the client closed the connection, body read or not."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gone = scope[GONE] = asyncio.Event()
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def received() -> Message:
            nonlocal watcher
            if watcher is not None:  # the watcher owns receive now: only a disconnect is left
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            elif not message.get("more_body", False):
                watcher = asyncio.create_task(watch(), name="watch-disconnect")
            return message

        try:
            await self.app(scope, received, send)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher


def submission(request: Request, requests: Sequence[ExecuteRequest]) -> Submission:
    """``requests`` as the queue takes them from this HTTP request: its tenant, and the event
    set when its client goes away."""
    gone = request.scope.get(GONE)
    if gone is None:  # served without the middleware (a test's app): never set
        return Submission(requests, tenant_of(request))
    return Submission(requests, tenant_of(request), gone)
