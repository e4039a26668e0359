"""The node's cores as tokens: how many executions start at full speed, apart from how many run.

A slot takes a job only while it holds a core token, so at most ``cores`` short programs run
at once, as before slots outnumbered cores. An execution still running ``straggler_after_s``
after it started gives its token back and runs on in its slot (its own process, limits and
verdict unchanged), sharing the cores with the executions that start after it: a program that
sleeps, waits on input or spins until its timeout holds a slot, not a core. With ``slots``
above ``cores``, hung programs then cost ``timeout`` once per batch, not ``timeout x hangers
/ cores`` (issue 31; docs/benchmarks.md, "Stragglers").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class Cores:
    """``count`` tokens; ``stragglers``: executions now past ``after_s`` (tokens given back).

    A freed token goes to the slot that began waiting last (a stack, not a queue): that is the
    slot that finished most recently, whose zygote's pages are still in the CPU's caches: a
    400-program batch on 16 slots ran on 3 of the 32 zygotes, where a first-come queue cycled
    them all. Short programs on 16 slots, 2 cores (loadtests.bench_sandboxfusion, 2026-12-06):
    284-314/s first-come, 307-333/s this way; the mixed batch of bench_stragglers showed no
    difference beyond its noise.
    """

    def __init__(self, count: int, after_s: float) -> None:
        self.count = count
        self.after_s = after_s
        self.stragglers = 0
        self.taken = 0  # tokens held: slots waiting for a job with one, or running at full speed
        self._free = count
        self._waiting: list[asyncio.Future[None]] = []

    async def take(self) -> None:
        """Wait for a free core (before taking a job: a slot without one leaves the job queued,
        where its deadline and the tenants' shares still apply)."""
        if self._free and not self._waiting:
            self._free -= 1
        else:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self._hand_on()  # it was ours already: pass it on
                elif handed in self._waiting:
                    self._waiting.remove(handed)
                raise
        self.taken += 1

    def give(self) -> None:
        self.taken -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiting:
            handed = self._waiting.pop()
            if not handed.done():
                handed.set_result(None)
                return
        self._free += 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The token ``take`` got, for one execution: given back when it ends, or once it has
        run ``after_s`` (0: only when it ends), whichever comes first."""
        state = {"held": True}

        def straggle() -> None:
            state["held"] = False
            self.stragglers += 1
            self.give()

        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.after_s, straggle) if self.after_s else None
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            if state["held"]:
                self.give()
            else:
                self.stragglers -= 1


class MemoryBudget:
    """Megabytes of ``memory_mb`` the running executions may ask for together (0: no bound):
    with slots above cores, what bounds a node's memory is the sum of its runs' limits."""

    def __init__(self, total_mb: int) -> None:
        self.total_mb = total_mb
        self.reserved_mb = 0
        self._freed = asyncio.Condition()

    async def reserve(self, mb: int) -> int:
        """Wait until ``mb`` (at most the whole budget) is free, and take it; what was taken."""
        if not self.total_mb:
            return 0
        mb = min(mb, self.total_mb)
        async with self._freed:
            await self._freed.wait_for(lambda: self.reserved_mb + mb <= self.total_mb)
            self.reserved_mb += mb
        return mb

    async def release(self, mb: int) -> None:
        if mb:
            async with self._freed:
                self.reserved_mb -= mb
                self._freed.notify_all()
