"""The zygote's watch over one running execution: the pipes, the timer, the capped output.

The zygote forks a child and hands the rest to this module: wait until the child exits,
runs out of wall-clock time, or writes more than the output cap; and drain what is left once
every writer is dead. ``judge.py`` turns what was seen into the service's status vocabulary.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

SETUP_ERROR = b"setup_error:"
SAMPLE_S = 0.05  # how often the tree's memory is sampled where no cgroup limits it
Sampler = Callable[[], bool]
Waited = Callable[[], float]  # seconds the program waited, runnable, for a CPU


@dataclass
class Pipes:
    stdin: int
    out_r: int
    out_w: int
    err_r: int
    err_w: int
    st_r: int
    st_w: int

    @classmethod
    def open(cls, stdin: bytes | memoryview) -> Pipes:
        fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
        if stdin:
            os.write(fd, stdin)
            os.lseek(fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        return cls(fd, out_r, out_w, err_r, err_w, st_r, st_w)

    def close_child_ends(self) -> None:
        for fd in (self.stdin, self.out_w, self.err_w, self.st_w):
            os.close(fd)

    def close_parent_ends(self) -> None:
        for fd in (self.out_r, self.err_r, self.st_r):
            os.close(fd)


@dataclass
class Capture:
    """Output of one stream, capped, read straight into ``buffer`` (``cap`` + 1 bytes, part of
    the zygote's payload buffer: no copy of it is left in the heap)."""

    cap: int
    buffer: memoryview
    length: int = 0
    truncated: bool = False

    @classmethod
    def of(cls, cap: int) -> Capture:
        """A capture with a buffer of its own (outside a zygote)."""
        return cls(cap, memoryview(bytearray(cap + 1)))

    def data(self) -> memoryview:
        return self.buffer[: self.length]

    def text(self) -> str:
        return self.data().tobytes().decode("utf-8", errors="replace")


@dataclass
class Watch:
    """What the supervisor saw while the child ran."""

    exited: bool = False
    reason: str | None = None  # "timeout" or "output" when we killed it
    end: float = 0.0
    extended_s: float = 0.0  # added to the wall-clock limit for time spent waiting for a CPU


def _read_into(fd: int, capture: Capture) -> bool:
    """Read what is there; False at end of file or when nothing more is there now."""
    try:
        n = os.readv(fd, [capture.buffer[capture.length :]])
    except BlockingIOError:
        return False
    capture.length += n
    if capture.length > capture.cap:
        capture.truncated = True
        capture.length = capture.cap
    return bool(n)


def _take(fd: int, pidfd: int, alarm: int | None, streams: dict[int, Capture],
          poller: select.poll, seen: Watch) -> None:  # fmt: skip
    """One ready descriptor: the child ended, the memory alarm, or output to read."""
    if fd == pidfd:
        seen.exited = True
    elif fd == alarm:
        seen.reason = "memory"
    elif not _read_into(fd, streams[fd]):
        poller.unregister(fd)


def watch(pidfd: int, streams: dict[int, Capture], timeout_s: float, start: float,
          alarm: int | None = None, over: Sampler | None = None,
          waited: Waited | None = None, max_extension_s: float = 0.0) -> Watch:  # fmt: skip
    """Wait until the child exits, runs out of time, or overflows an output cap, or until
    the tree goes over its memory limit: ``alarm`` (the memory cgroup's OOM eventfd) is
    readable, or ``over`` (called every ``SAMPLE_S`` where there is no cgroup) says so.
    Out of time means ``timeout_s`` of wall clock, plus what ``waited`` says the child spent
    waiting for a CPU that others held, up to ``max_extension_s`` more."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if alarm is not None:
        poller.register(alarm, select.POLLIN)
    for fd in streams:
        poller.register(fd, select.POLLIN)
    deadline = start + timeout_s
    seen = Watch()
    next_sample = start + SAMPLE_S
    while not seen.exited:
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0 and waited is not None:
            seen.extended_s = min(waited(), max_extension_s)
            deadline = start + timeout_s + seen.extended_s
            remaining = deadline - now
        if remaining <= 0:
            seen.reason = "timeout"
            break
        if over is not None and now >= next_sample:
            next_sample = now + SAMPLE_S
            if over():
                seen.reason = "memory"
                break
        wait = min(remaining, next_sample - now) if over is not None else remaining
        for fd, _ in poller.poll(wait * 1000 + 1):
            _take(fd, pidfd, alarm, streams, poller, seen)
        if any(c.truncated for c in streams.values()):
            seen.reason = "output"
            break
        if seen.reason == "memory":
            break
    seen.end = time.monotonic()
    return seen


def drain(streams: dict[int, Capture]) -> None:
    """After every writer is dead: read what is left in the pipes."""
    for fd, capture in streams.items():
        os.set_blocking(fd, False)
        while not capture.truncated and _read_into(fd, capture):
            pass
