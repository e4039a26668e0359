"""The zygote's watch over one running execution: the pipes, the timer, the capped output.

The zygote forks a child and hands the rest to this module: wait until the child exits,
runs out of wall-clock time, or writes more than the output cap; and drain what is left once
every writer is dead. ``judge.py`` turns what was seen into the service's status vocabulary.

The child's exit is a readable descriptor: its pidfd, or where the kernel has no
``pidfd_open`` (gVisor 20221219: ENOSYS) a pipe that SIGCHLD writes into
(``signal.set_wakeup_fd``), after which ``waitid(WNOWAIT)`` says whether it was this child
(other descendants' ends wake it too) without reaping it: ``wait4`` after the clean-up still
gets its status and usage.
"""

from __future__ import annotations

import errno
import os
import select
import signal
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


class ChildExit:
    """A child's exit as a readable descriptor: its pidfd."""

    asked_each_tick = False  # also asked every SAMPLE_S, not only when readable

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)

    def exited(self) -> bool:
        """Whether the child has ended, now that ``fd`` was readable."""
        return True

    def close(self) -> None:
        os.close(self.fd)


class SigchldExit(ChildExit):
    """A child's exit without pidfds: readable on any SIGCHLD (``install`` once per zygote).
    Asked every ``SAMPLE_S`` too: once in CI under gVisor, a run whose program had printed and
    ended was answered ``timeout`` (not seen again in local runs); a missed wakeup then costs
    at most one interval, not the run's whole limit."""

    asked_each_tick = True
    pipe: tuple[int, int] | None = None

    def __init__(self, pid: int) -> None:
        assert SigchldExit.pipe is not None, "SigchldExit.install() first"
        self.pid = pid
        self.fd = SigchldExit.pipe[0]

    def exited(self) -> bool:
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.pid, flags) is not None

    def close(self) -> None:
        pass  # the pipe serves every execution

    @classmethod
    def install(cls) -> None:
        """SIGCHLD writes a byte into the pipe; a forked child has neither (its descriptors
        are its own: a byte in a file it opened under that number would be a corruption)."""
        cls.pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(cls.pipe[1], warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=cls._forget)

    @classmethod
    def _forget(cls) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def exit_watcher() -> tuple[type[ChildExit], str | None]:
    """How this kernel lets the zygote wait for a child, and why not with a pidfd if not."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return ChildExit, None
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM):
            raise
        SigchldExit.install()
        why = f"pidfd_open: {errno.errorcode[exc.errno]} ({exc.strerror})"
        return SigchldExit, f"{why}: a child's end is SIGCHLD through a pipe, then waitid"


def _take(fd: int, child: ChildExit, alarm: int | None, streams: dict[int, Capture],
          poller: select.poll, seen: Watch) -> None:  # fmt: skip
    """One ready descriptor: the child ended, the memory alarm, or output to read."""
    if fd == child.fd:
        seen.exited = child.exited()
    elif fd == alarm:
        seen.reason = "memory"
    elif not _read_into(fd, streams[fd]):
        poller.unregister(fd)


def watch(child: ChildExit, streams: dict[int, Capture], timeout_s: float, start: float,
          alarm: int | None = None, over: Sampler | None = None,
          waited: Waited | None = None, max_extension_s: float = 0.0) -> Watch:  # fmt: skip
    """Wait until the child exits, runs out of time, or overflows an output cap, or until
    the tree goes over its memory limit: ``alarm`` (the memory cgroup's OOM eventfd) is
    readable, or ``over`` (called every ``SAMPLE_S`` where there is no cgroup) says so.
    Out of time means ``timeout_s`` of wall clock, plus what ``waited`` says the child spent
    waiting for a CPU that others held, up to ``max_extension_s`` more."""
    poller = select.poll()
    poller.register(child.fd, select.POLLIN)
    if alarm is not None:
        poller.register(alarm, select.POLLIN)
    for fd in streams:
        poller.register(fd, select.POLLIN)
    deadline = start + timeout_s
    seen = Watch()
    next_sample = start + SAMPLE_S
    ticks = over is not None or child.asked_each_tick
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
        if ticks and now >= next_sample:
            next_sample = now + SAMPLE_S
            if child.asked_each_tick and child.exited():
                seen.exited = True
                break
            if over is not None and over():
                seen.reason = "memory"
                break
        wait = min(remaining, next_sample - now) if ticks else remaining
        for fd, _ in poller.poll(wait * 1000 + 1):
            _take(fd, child, alarm, streams, poller, seen)
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
