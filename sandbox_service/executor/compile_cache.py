"""A node's compiled programs, by content, shared by its slots: compile once, run many times.

verl sends one request per test case, each with the same solution: a 20-case problem is 20
requests that need one compile. The key is a hash of everything that decides the build (the
source, the files beside it, the language's compile command and its toolchain's version:
``compiler.cache_key``), never a name a caller chose, so a program can only ever be served
its own build. The builds live in the memory of the process that runs the slots (the
trusted side): the compile ran in a confined child like any execution, the zygote read its
output without following links, and no execution can write here; each run receives a copy
in its own working directory.

A build is made once even when several slots ask for it at the same moment (the others wait
for it); the cache is bounded in bytes, least recently used first out (a bound of 0 turns it
off: every request compiles, as in SandboxFusion and code-judge). A compile error is
kept too (the same source fails the same way); a compile that ran out of time is not (a
busy node may be why).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sandbox_service.executor.protocol import RunStatus

KEPT = (RunStatus.ok, RunStatus.error, RunStatus.output_limit)  # decided by the source alone


@dataclass(frozen=True, kw_only=True)
class Build:
    """How one compile ended and, when it succeeded, the files the run needs."""

    status: RunStatus  # the compile's own: ok, or how it failed
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    wall_time_s: float = 0.0
    message: str = ""
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.ok

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.files.values()) + len(self.stdout) + len(self.stderr)


class CompileCache:
    """Builds by key, bounded to ``max_bytes``; ``hits`` and ``misses`` counted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._builds: OrderedDict[str, Build] = OrderedDict()
        self._making: dict[str, asyncio.Future[Build]] = {}

    def __len__(self) -> int:
        return len(self._builds)

    async def get(self, key: str, make: Callable[[], Awaitable[Build]]) -> tuple[Build, bool]:
        """(the build of ``key``, whether it was already made or being made); ``make`` runs
        only when neither. A caller whose ``make`` fails gets its exception; the callers that
        waited for it make the build themselves."""
        if not self.max_bytes:
            self.misses += 1
            return await make(), False
        build = self._builds.get(key)
        if build is not None:
            self._builds.move_to_end(key)
            self.hits += 1
            return build, True
        making = self._making.get(key)
        if making is not None:
            try:
                build = await asyncio.shield(making)
            except Exception:
                pass  # its slot died or stopped: make it here
            else:
                self.hits += 1
                return build, True
        return await self._make(key, make), False

    async def _make(self, key: str, make: Callable[[], Awaitable[Build]]) -> Build:
        future: asyncio.Future[Build] = asyncio.get_running_loop().create_future()
        self._making[key] = future
        self.misses += 1
        try:
            build = await make()
        except BaseException as exc:
            future.set_exception(RuntimeError(f"the compile was interrupted: {exc!r}"))
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            if self._making.get(key) is future:
                del self._making[key]
        future.set_result(build)
        if build.status in KEPT:
            self._keep(key, build)
        return build

    def _keep(self, key: str, build: Build) -> None:
        if build.size > self.max_bytes or key in self._builds:
            return
        self._builds[key] = build
        self.bytes += build.size
        while self.bytes > self.max_bytes:
            _, old = self._builds.popitem(last=False)
            self.bytes -= old.size
