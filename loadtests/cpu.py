"""Per-execution CPU by role (client, API, Redis, worker, zygotes, children), read from /proc.

Children's CPU is their parents' ``cutime``/``cstime`` (``/proc/PID/stat``): the kernel adds a
child's whole CPU, its reaped descendants' and its exit included, to its parent's when the
parent reaps it, so every execution is counted once and exactly, to the clock tick (10 ms per
process per reading: under 0.01 ms per execution over a run of 2,000).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadtests.procwatch import CLK_TCK, Proc, all_procs, past_keeper, read_proc, tree

ROLES = ("client", "api", "redis", "worker", "zygote", "children")
SERVICE_ROLES = ROLES[1:]  # what the service (or the floor) spends, the client left out
ZYGOTE = "sandbox_service.executor.zygote"

Pids = Callable[[], Sequence[int]]
Reading = dict[str, dict[int, Proc]]
PerExecution = dict[str, tuple[float, float]]  # role -> (user ms, system ms) per execution


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")
    return ""


def children_of(parents: Pids, marker: str = "") -> Pids:
    """The children of ``parents`` (at the time of each reading) whose command line holds
    ``marker``: a service's zygotes, code-judge's worker processes."""

    def pids() -> list[int]:
        wanted = set(parents())
        procs = all_procs()
        found = [p.pid for p in procs.values() if p.ppid in wanted and marker in cmdline(p.pid)]
        return sorted(past_keeper(pid, procs) for pid in found)

    return pids


def zygotes_of(pids: Sequence[int]) -> list[int]:
    """The zygotes themselves, given what a slot knows as its zygotes (keepers or not)."""
    procs = all_procs()
    return [past_keeper(pid, procs) for pid in pids]


def tree_of(root: Pids) -> Pids:
    """``root`` and everything below it: a server with worker processes of its own."""
    return lambda: [p.pid for r in root() for p in tree(r)]


def fixed(*pids: int) -> Pids:
    return lambda: list(pids)


@dataclass
class Roles:
    """Which processes play which part, found again at each reading (a zygote that died has a
    successor); ``children``: the role whose reaped children are the executions."""

    parts: dict[str, Pids]
    children: str = "zygote"

    def read(self) -> Reading:
        reading: Reading = {}
        for role, pids in self.parts.items():
            procs = (read_proc(pid) for pid in pids())
            reading[role] = {p.pid: p for p in procs if p is not None}
        return reading


def _ticks(before: dict[int, Proc], after: dict[int, Proc], name: str) -> int:
    # A process that appeared between the readings counts from zero; one that vanished (a
    # zygote killed) takes its CPU with it.
    total = 0
    for pid, p in after.items():
        total += getattr(p, name) - (getattr(before[pid], name) if pid in before else 0)
    return total


def per_execution(roles: Roles, before: Reading, after: Reading, n: int) -> PerExecution:
    ms = 1000 / CLK_TCK / max(n, 1)
    out: PerExecution = {}
    for role in roles.parts:
        b, a = before.get(role, {}), after.get(role, {})
        out[role] = (_ticks(b, a, "utime") * ms, _ticks(b, a, "stime") * ms)
    b, a = before.get(roles.children, {}), after.get(roles.children, {})
    out["children"] = (_ticks(b, a, "cutime") * ms, _ticks(b, a, "cstime") * ms)
    return out


def total_ms(cpu: PerExecution, roles: Sequence[str] = SERVICE_ROLES) -> float:
    return sum(sum(cpu.get(role, (0.0, 0.0))) for role in roles)


@dataclass
class Meter:
    """CPU of ``roles`` between ``begin`` and ``end``; ``extra`` reads anything else to take
    the difference of (Redis round trips), per execution."""

    roles: Roles
    extra: Callable[[], float] | None = None
    _before: Reading = field(default_factory=dict)
    _extra: float = 0.0

    def begin(self) -> None:
        self._before = self.roles.read()
        if self.extra is not None:
            self._extra = self.extra()

    def end(self, n: int) -> tuple[PerExecution, float | None]:
        cpu = per_execution(self.roles, self._before, self.roles.read(), n)
        more = None if self.extra is None else (self.extra() - self._extra) / max(n, 1)
        return cpu, more


def me() -> Pids:
    return fixed(os.getpid())
