"""Tool dispatch: a turn's tool calls sent the moment the turn ends, gathered into batches.

*Synchronous tools* (rStar2-Agent, section 4) make every rollout wait for the slowest turn of a
round and then for the slowest call of a batch. :class:`ToolDispatcher` sends a turn's calls as
soon as the turn ends, gathered by a short window (``batch_size`` calls or ``timeout_s`` after
the first, whichever comes first) into one batch request; several batches may be in flight, so
nobody waits for another's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sandbox_service.models import ExecuteRequest, ExecuteResult
from trainer.futures import settle


class ToolRunner(Protocol):
    """Executes a batch of programs; results in request order. The sandbox client is one."""

    async def run(self, calls: list[ExecuteRequest]) -> list[ExecuteResult]: ...


@dataclass
class DispatchStats:
    calls: int = 0
    batches: list[int] = field(default_factory=list)  # calls per batch request, in send order
    wait_s: float = 0.0  # summed over calls: from the turn's end to its results


class ToolDispatcher:
    """Tool calls go out the moment a turn ends, gathered into batch requests by a window: a
    batch leaves when it holds ``batch_size`` calls, or ``timeout_s`` after the oldest call
    waiting in it arrived."""

    def __init__(self, runner: ToolRunner, batch_size: int, timeout_s: float) -> None:
        if batch_size < 1 or timeout_s < 0:
            raise ValueError("ToolDispatcher: batch_size >= 1 and timeout_s >= 0")
        self.runner, self.batch_size, self.timeout_s = runner, batch_size, timeout_s
        self.stats = DispatchStats()
        self._buffer: list[tuple[ExecuteRequest, asyncio.Future[ExecuteResult]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def run(self, calls: Sequence[ExecuteRequest]) -> list[ExecuteResult]:
        """The results of ``calls``, in order, once the batch (or batches) holding them return."""
        if not calls:
            return []
        loop = asyncio.get_running_loop()
        start = loop.time()
        futures = [loop.create_future() for _ in calls]
        self._buffer.extend(zip(calls, futures, strict=True))
        while len(self._buffer) >= self.batch_size:
            batch, self._buffer = (
                self._buffer[: self.batch_size],
                self._buffer[self.batch_size :],
            )
            self._send(batch)
        if not self._buffer and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        elif self._buffer and self._timer is None:
            self._timer = loop.call_later(self.timeout_s, self._flush)
        results = list(await asyncio.gather(*futures))
        self.stats.calls += len(calls)
        self.stats.wait_s += (loop.time() - start) * len(calls)
        return results

    async def aclose(self) -> None:
        """Send what is buffered and wait for every batch in flight."""
        self._flush()
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    def _flush(self) -> None:
        self._timer = None
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self._send(batch)

    def _send(self, batch: list[tuple[ExecuteRequest, asyncio.Future[ExecuteResult]]]) -> None:
        self.stats.batches.append(len(batch))
        task = asyncio.create_task(self._execute(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _execute(
        self, batch: list[tuple[ExecuteRequest, asyncio.Future[ExecuteResult]]]
    ) -> None:
        await settle([f for _, f in batch], self.runner.run([call for call, _ in batch]))
