"""The parent's side of one execution: the pipes, the timer, the capped output.

The zygote forks a child and hands the rest to this module: wait until the child exits,
runs out of wall-clock time, or writes more than the output cap; and drain what is left once
every writer is dead. ``judge.py`` turns what was seen into the service's status vocabulary.
"""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass

SETUP_ERROR = b"setup_error:"


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


def watch(pidfd: int, streams: dict[int, Capture], timeout_s: float, start: float) -> Watch:
    """Wait until the child exits, runs out of time, or overflows an output cap."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    for fd in streams:
        poller.register(fd, select.POLLIN)
    deadline = start + timeout_s
    seen = Watch()
    while not seen.exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            seen.reason = "timeout"
            break
        for fd, _ in poller.poll(remaining * 1000 + 1):
            if fd == pidfd:
                seen.exited = True
            elif not _read_into(fd, streams[fd]):
                poller.unregister(fd)
        if any(c.truncated for c in streams.values()):
            seen.reason = "output"
            break
    seen.end = time.monotonic()
    return seen


def drain(streams: dict[int, Capture]) -> None:
    """After every writer is dead: read what is left in the pipes."""
    for fd, capture in streams.items():
        os.set_blocking(fd, False)
        while not capture.truncated and _read_into(fd, capture):
            pass
