"""Serving an app with uvicorn, with the shutdown this service promises.

On SIGTERM or SIGINT: stop accepting, tell the runtime (no new work; queued work has
``graceful_shutdown_s`` to finish, then is answered ``rejected``), let uvicorn deliver the
answers of requests in flight, then the lifespan stops the slots (no child left behind).
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

from sandbox_service.api.app import create_app
from sandbox_service.executor.isolation import set_dumpable
from sandbox_service.runtime.base import Runtime
from sandbox_service.runtime.embedded import EmbeddedRuntime
from sandbox_service.settings import Settings

# After the runtime's grace period, answers still have to be written out.
DELIVERY_GRACE_S = 5.0


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
    rt: Runtime = runtime if runtime is not None else EmbeddedRuntime(settings)
    app = create_app(settings, rt)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # thousands of executions a second; metrics say more
        loop="auto",
        http="auto",
        backlog=4096,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=int(settings.graceful_shutdown_s + DELIVERY_GRACE_S),
    )
    Server(config, rt).run()
