"""An asyncio event loop on simulated time: when nothing is ready, the clock jumps to the next
timer instead of waiting for it.

Code that reads time only from its running loop (``loop.time()``, ``asyncio.sleep``,
``call_later``) runs unchanged on it, the rollout scheduler included, and a run of any
simulated length takes only the time its callbacks need. It is deterministic: no I/O, no
threads, and callbacks run in the order asyncio gives them. A run in which every task waits
on something that nothing will ever do raises :class:`Deadlock` instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    pass


class _JumpingSelector(selectors.SelectSelector):
    """Registers descriptors like any selector (the loop registers its wake-up pipe) but never
    waits: asked to wait ``timeout`` seconds, it moves the clock on by that much instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise Deadlock("simulation deadlocked: nothing is ready and no timer is set")
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on simulated time, starting at 0."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(_settle(left))
        loop.close()


async def _settle(tasks: set[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
