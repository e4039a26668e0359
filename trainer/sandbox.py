"""Tool runners: where the rollout loop's programs run.

- :class:`SandboxRunner`: the sandbox service, through its async client, in batches (the
  production path; ``--sandbox-url http://...``).
- :func:`start_embedded_service`: starts a local service when no URL is given.
- :class:`SubprocessRunner`: a fresh ``python -I -c`` per call on this machine, with a timeout
  and nothing else. **No isolation**: for tests and development only, chosen explicitly with
  ``--sandbox-url subprocess``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from trainer.rollout import ToolRunner

SUBPROCESS = "subprocess"


class SandboxRunner:
    """Runs calls on the sandbox service: one ``execute_batch`` per ``max_batch`` calls, the
    chunks sent concurrently (the service's default batch limit is 1024)."""

    def __init__(self, base_url: str, max_batch: int = 1024) -> None:
        self.base_url, self.max_batch = base_url, max_batch
        self._client: Any = None

    async def __aenter__(self) -> SandboxRunner:
        # Imported here so the trainer (and its tests) load without the client's dependencies.
        from sandbox_service.client import AsyncSandboxClient

        self._client = await AsyncSandboxClient(self.base_url).__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client.__aexit__(exc_type, exc, tb)

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]:
        chunks = [calls[i : i + self.max_batch] for i in range(0, len(calls), self.max_batch)]
        answers = await asyncio.gather(*(self._client.execute_batch(chunk) for chunk in chunks))
        return [result for answer in answers for result in answer]


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
# SANDBOX START-UP, owned by the service side: replace this function's body with the service's
# own embedded start-up when it lands. The contract the trainer relies on: a context manager
# that yields the base URL of a ready service (``/readyz`` answers 200) and stops it on exit.
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def start_embedded_service(ready_timeout_s: float = 60.0) -> Iterator[str]:
    """``sandbox-service serve`` on a free local port, for as long as the ``with`` lasts."""
    import httpx

    port = _free_port()
    env = dict(os.environ, SANDBOX_HOST="127.0.0.1", SANDBOX_PORT=str(port))
    process = subprocess.Popen([sys.executable, "-m", "sandbox_service.cli", "serve"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the embedded sandbox service exited ({process.returncode})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded sandbox service was not ready in {ready_timeout_s} s"
                )
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
