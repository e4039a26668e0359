"""Watches a local service from outside: its process tree through /proc, its queue via /v1/status.

Given the PID of the API process (or found from the port it listens on), each sample reads
``/proc`` for the whole tree below it (API process, zygotes, running executions and whatever
they spawned): the API process's resident memory, the zygotes' resident memory (what grows
if a zygote leaks), the whole tree's proportional memory (PSS: pages shared between a zygote
and its children count once; the footprint), the number of processes and zombies, and the
CPU time of the tree including children already reaped. ``/v1/status`` gives queue depth and
jobs running. Before and after the run it counts the entries under the directories it is
given (the service's work root and TMPDIR), so leaked working directories and files show.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20
LISTEN = "0A"
SETTLE_S = 10.0


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    # Clock ticks (SC_CLK_TCK): its own user and system time, and those of its children
    # (and their descendants) that it has reaped.
    utime: int
    stime: int
    cutime: int
    cstime: int
    rss_mb: float

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime + self.cutime + self.cstime


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return Proc(pid, int(fields[1]), fields[0], utime, stime, cutime, cstime,
                int(fields[21]) * PAGE_MB)  # fmt: skip


def all_procs() -> dict[int, Proc]:
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                procs[proc.pid] = proc
    return procs


def past_keeper(pid: int, procs: dict[int, Proc]) -> int:
    """The zygote itself where ``pid`` is its keeper (``executor.startup``): the child that is
    pid 1 of a namespace of its own, whose reaped children are the executions; else ``pid``."""
    for child in (p.pid for p in procs.values() if p.ppid == pid):
        with contextlib.suppress(OSError), open(f"/proc/{child}/status") as f:
            for line in f:
                if line.startswith("NSpid:") and line.split()[-1] == "1":
                    return child
    return pid


def keepers(procs: list[Proc], table: dict[int, Proc]) -> set[int]:
    """Which of ``procs`` are zygotes' keepers (a bare interpreter each, counted with its
    zygote rather than as a process of its own)."""
    return {p.pid for p in procs if past_keeper(p.pid, table) != p.pid}


def tree(root: int, procs: dict[int, Proc] | None = None) -> list[Proc]:
    """``root`` and every process below it, root first."""
    procs = all_procs() if procs is None else procs
    if root not in procs:
        return []
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = [], deque([root])
    while todo:
        pid = todo.popleft()
        found.append(procs[pid])
        todo.extend(children.get(pid, []))
    return found


def pss_mb(pid: int) -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """The process that listens on ``port`` (the topmost one if several share the socket)."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not inodes:
        return None
    holders = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{name}/fd")
            if any(os.readlink(f"/proc/{name}/fd/{fd}") in inodes for fd in fds):
                holders.add(int(name))
    if not holders:
        return None
    procs = {pid: read_proc(pid) for pid in holders}
    tops = [pid for pid, p in procs.items() if p is not None and p.ppid not in holders]
    return min(tops or holders)


def count_entries(path: str | None) -> int | None:
    if not path or not os.path.isdir(path):
        return None
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))


def count_all(paths: Sequence[str]) -> int | None:
    counts = [n for n in map(count_entries, paths) if n is not None]
    return sum(counts) if counts else None


@dataclass
class Sample:
    t: float  # seconds since the watch began
    api_rss_mb: float
    zygotes_rss_mb: float
    tree_pss_mb: float
    processes: int
    zombies: int
    cpu_s: float
    waiting: int | None = None
    running: int | None = None


class Watcher:
    """Samples a service's process trees every ``interval_s`` and its status as often as it
    answers. ``pids``: the API process first, then any worker processes (Redis mode); the
    zygotes are the children of any of them. ``begin`` and ``end`` take the samples the leak
    checks compare."""

    def __init__(
        self,
        pids: int | Sequence[int],
        url: str | None = None,
        scratch: Sequence[str] = (),
        interval_s: float = 1.0,
    ) -> None:
        self.pids = [pids] if isinstance(pids, int) else list(pids)
        self.url = url
        self.scratch = list(scratch)
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self.entries: dict[str, int | None] = {}
        self.idle_processes: dict[str, int] = {}
        self.depth_max = 0
        self.last_depth: int | None = None
        self._status: tuple[float, int, int] | None = None
        self._http: httpx.AsyncClient | None = None

    def sample(self) -> Sample | None:
        table = all_procs()
        trees = [tree(pid, table) for pid in self.pids]
        if not trees[0]:
            return None
        procs = list({p.pid: p for t in trees for p in t}.values())
        zygotes = [table[past_keeper(p.pid, table)] for p in procs if p.ppid in self.pids]
        now = time.monotonic()
        waiting = running = None
        if self._status is not None and now - self._status[0] < 3 * self.interval_s:
            _, waiting, running = self._status
        s = Sample(
            t=round(now - self.started, 3),
            api_rss_mb=round(trees[0][0].rss_mb, 1),
            zygotes_rss_mb=round(sum(p.rss_mb for p in zygotes), 1),
            tree_pss_mb=round(sum(pss_mb(p.pid) for p in procs), 1),
            processes=len(procs) - len(keepers(procs, table)),
            zombies=sum(p.state == "Z" for p in procs),
            cpu_s=sum(p.cpu_ticks for p in procs) / CLK_TCK,
            waiting=waiting,
            running=running,
        )
        self.samples.append(s)
        return s

    async def poll_status(self) -> tuple[int, int] | None:
        if self._http is None:
            return None
        try:
            data = (await self._http.get("/v1/status")).json()
            waiting, running = int(data["queue_depth"]), int(data["in_flight"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None  # down, or answering why not (503 while its Redis is away)
        self._status = (time.monotonic(), waiting, running)
        self.last_depth = waiting + running
        self.depth_max = max(self.depth_max, self.last_depth)
        return waiting, running

    async def begin(self) -> None:
        self.started = time.monotonic()
        if self.url is not None:
            timeout = httpx.Timeout(max(5.0, 5 * self.interval_s))
            self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)
            await self.poll_status()
        self.entries["start"] = count_all(self.scratch)
        first = self.sample()
        if first is not None:
            self.idle_processes["start"] = first.processes

    async def run(self) -> None:
        async def statuses() -> None:
            while True:
                await self.poll_status()
                await asyncio.sleep(self.interval_s)

        poller = asyncio.create_task(statuses())
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                self.sample()
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def end(self) -> None:
        """Wait (briefly) for the service to go idle, then take the closing samples."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            status = await self.poll_status()
            if status is None or status == (0, 0):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # children of the last executions are reaped
        last = self.sample()
        if last is not None:
            self.idle_processes["end"] = last.processes
        self.entries["end"] = count_all(self.scratch)
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def cpu_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        return self.samples[-1].cpu_s - self.samples[0].cpu_s

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"pids": self.pids, "samples": 0}
        s = self.samples

        def span(name: str) -> dict[str, float]:
            values = [getattr(x, name) for x in s]
            return {"start": values[0], "end": values[-1], "max": max(values)}

        at_depth = [x for x in s if x.waiting is not None and x.running is not None]
        deepest = max(at_depth, key=lambda x: (x.waiting or 0) + (x.running or 0), default=None)
        return {
            "pids": self.pids,
            "samples": len(s),
            "interval_s": self.interval_s,
            "api_rss_mb": span("api_rss_mb"),
            "zygotes_rss_mb": span("zygotes_rss_mb"),
            "tree_pss_mb": span("tree_pss_mb"),
            "processes": span("processes"),
            "zombies_max": max(x.zombies for x in s),
            "idle_processes": dict(self.idle_processes),
            "scratch_dirs": self.scratch,
            "scratch_entries": dict(self.entries),
            "depth_max": self.depth_max,
            "api_rss_mb_at_depth_max": deepest.api_rss_mb if deepest else None,
            "cpu_s": self.cpu_s(),
        }

    def series(self) -> list[dict[str, Any]]:
        return [asdict(x) for x in self.samples]
