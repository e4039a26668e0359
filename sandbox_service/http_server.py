"""Serving an app with uvicorn, with the shutdown this service promises.

On SIGTERM or SIGINT: stop accepting, tell the runtime (no new work; queued work has
``graceful_shutdown_s`` to finish, then is answered ``rejected``), let uvicorn deliver the
answers of requests in flight, then the lifespan stops the slots (no child left behind).

Connections are guarded (uvicorn alone never times out a connection before its first response,
and its ``limit_concurrency`` answers 503 but keeps the socket): one that has not sent a whole
request ``http_read_timeout_s``
after it opened or after its last response is closed (nothing sent, half a head, half a body
alike), and past ``max_connections`` the longest idle one makes room. The descriptor limit is
raised to its hard limit at start, and the default cap stays below it.
"""

from __future__ import annotations

import asyncio
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sandbox_service.api.app import create_app
from sandbox_service.descriptors import raise_fd_limit
from sandbox_service.executor.isolation import set_dumpable
from sandbox_service.runtime.base import Runtime
from sandbox_service.runtime.embedded import EmbeddedRuntime
from sandbox_service.settings import Settings

# After the runtime's grace period, answers still have to be written out.
DELIVERY_GRACE_S = 5.0
# Descriptors kept for what is not a client: slots' pipes and cgroup files, Redis, logs.
FD_RESERVE = 256
FD_PER_SLOT = 16

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as BaseProtocol
except ImportError:  # httptools is optional in uvicorn
    BaseProtocol = H11Protocol  # type: ignore[assignment,misc]


def connection_cap(settings: Settings, fd_limit: int) -> int:
    if settings.max_connections:
        return settings.max_connections
    return max(64, fd_limit - FD_RESERVE - FD_PER_SLOT * settings.slots)


class GuardedProtocol(BaseProtocol):
    """uvicorn's HTTP protocol with a deadline for each request to arrive, and a cap."""

    read_timeout_s: float = 30.0
    max_connections: int = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._since = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None

    def waiting(self) -> bool:
        """Waiting for the client: no request, its head or its body still on the way."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def _arm(self) -> None:
        self._since = time.monotonic()
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.read_timeout_s, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.waiting() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        if len(self.connections) <= self.max_connections:
            return
        idle = [c for c in self.connections if isinstance(c, GuardedProtocol) and c.waiting()]
        idle = [c for c in idle if c is not self and not c.transport.is_closing()]
        victim = min(idle, key=lambda c: c._since) if idle else self
        victim.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()


def guarded_protocol(settings: Settings, fd_limit: int) -> type[GuardedProtocol]:
    return type(
        "Guarded",
        (GuardedProtocol,),
        {
            "read_timeout_s": settings.http_read_timeout_s,
            "max_connections": connection_cap(settings, fd_limit),
        },
    )


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            asyncio.get_running_loop().call_soon(self.runtime.begin_shutdown)
        except RuntimeError:  # no loop yet: nothing is in flight
            pass
        super().handle_exit(sig, frame)


def serve(settings: Settings, runtime: Runtime | None = None) -> None:
    # Executions may share our uid (the non-root fallback): keep our /proc and memory theirs not.
    set_dumpable(False)
    fd_limit = raise_fd_limit()
    rt: Runtime = runtime if runtime is not None else EmbeddedRuntime(settings)
    app = create_app(settings, rt)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # thousands of executions a second; metrics say more
        loop="auto",
        http=guarded_protocol(settings, fd_limit),
        backlog=4096,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=int(settings.graceful_shutdown_s + DELIVERY_GRACE_S),
    )
    Server(config, rt).run()
