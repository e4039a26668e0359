"""Tool runners: where the rollout loop's programs run.

- :class:`SandboxRunner`: the sandbox service through its async client, one batch a round
  (the production path; ``--sandbox-url http://...``).
- :func:`start_embedded_service`: a local service (``sandbox-service serve``) for a run that
  was given no URL.
- :class:`TimedRunner`: any runner, with the wall time its calls took (a step's tool time).
- :class:`SubprocessRunner`: a fresh ``python -I -c`` per call on this machine, with a timeout
  and nothing else. **No isolation**, and ``repl`` mode is run as a plain script: for tests and
  development only, chosen explicitly with ``--sandbox-url subprocess``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from sandbox_service.client import AsyncSandboxClient
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.service_process import launch
from trainer.rollout import ToolRunner

SUBPROCESS = "subprocess"


class SandboxRunner:
    """Runs calls on the sandbox service: the whole round in one ``execute_batch`` (the client
    cuts it into server-sized chunks and sends them concurrently)."""

    def __init__(self, base_url: str) -> None:
        self.client = AsyncSandboxClient(base_url)

    async def __aenter__(self) -> SandboxRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        return await self.client.execute_batch(calls)


class SubprocessRunner:
    """Each call in a fresh interpreter, ``concurrency`` at a time. Not a sandbox."""

    def __init__(self, concurrency: int = 4) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self.executed = 0

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        return list(await asyncio.gather(*(self._run_one(call) for call in calls)))

    async def _run_one(self, call: ExecuteRequest) -> ExecuteResult:
        async with self._slots:
            start = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-c",
                call.code,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            try:
                out, err = await asyncio.wait_for(
                    process.communicate(call.stdin.encode()), call.timeout_s
                )
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
                return ExecuteResult(status=Status.timeout, message=f"ran past {call.timeout_s} s")
            self.executed += 1
            return ExecuteResult(
                status=Status.ok if process.returncode == 0 else Status.error,
                exit_code=process.returncode,
                stdout=out.decode(errors="replace"),
                stderr=err.decode(errors="replace"),
                wall_time_s=time.monotonic() - start,
            )


class TimedRunner:
    """Wraps a runner and measures the wall time during which at least one of its batches was
    running (``busy_s``): the tool's share of a step, whether the rollout loop waits for each
    round or overlaps calls with generation."""

    def __init__(self, runner: ToolRunner) -> None:
        self.runner = runner
        self.busy_s = 0.0
        self._running, self._since = 0, 0.0

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        if self._running == 0:
            self._since = time.monotonic()
        self._running += 1
        try:
            return await self.runner.run(calls)
        finally:
            self._running -= 1
            if self._running == 0:
                self.busy_s += time.monotonic() - self._since


@contextlib.asynccontextmanager
async def open_runner(sandbox_url: str | None) -> AsyncIterator[ToolRunner]:
    """The runner a command asked for: a service URL, ``subprocess``, or None (embedded)."""
    if sandbox_url == SUBPROCESS:
        yield SubprocessRunner(concurrency=os.cpu_count() or 1)
        return
    with contextlib.ExitStack() as stack:
        url = sandbox_url or stack.enter_context(start_embedded_service())
        async with SandboxRunner(url) as runner:
            yield runner


# ---------------------------------------------------------------------------------------------
# SANDBOX START-UP, owned by the service side. The contract the trainer relies on: a context
# manager that yields the base URL of a ready service and stops it on exit.
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def start_embedded_service(slots: int | None = None) -> Iterator[str]:
    """``sandbox-service serve`` on a free loopback port, for as long as the ``with`` lasts."""
    # The service dies with the trainer, even one killed with SIGKILL (no finally runs then).
    sizes: dict[str, Any] = {} if slots is None else {"slots": slots}
    with launch(die_with_starter=True, **sizes) as service:
        yield service.url
