"""The one buffer in which a zygote holds an execution's bytes, wiped after every execution.

Every child is a copy of its zygote's memory. Bytes of an execution left in the zygote (the
frame it received, strings decoded from it, output it captured, the result it sent, even once
freed: the allocator does not clear them) would be readable by the next child on the slot
from its own memory (``/proc/self/mem``), whoever sent that next request: within one training
run, a rollout could read a sibling's answer to the same problem. So the zygote never makes a
Python object of a request's code, stdin or files or of a result's output. It receives them
into this buffer (``protocol.recv_header`` + ``receive``), writes stdin into the child's memfd
from it, lets the child decode code and files in the child's own memory, reads the child's
output from the pipes into it, sends the result from it, and then zeroes every byte it used,
before the next request can arrive. The child, which sees its own request in its copy, zeroes
that too before user code runs (a driver program forks user code off it: ``cell_driver.py``).

Private anonymous memory: a child's writes to its copy never reach the zygote's.
"""

from __future__ import annotations

import contextlib
import mmap
import socket
from typing import Any

from sandbox_service.executor import protocol

MIB = 1024 * 1024
SLACK = 4 * MIB  # room for an ordinary request beside the output buffers, mapped at start


def _round_up(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


class Payload:
    """A private anonymous mapping used from its start, one execution at a time."""

    def __init__(self, size: int) -> None:
        self.size = _round_up(size + SLACK)
        self._map = self._new(self.size)
        self._view = memoryview(self._map)
        self.used = 0

    @staticmethod
    def _new(size: int) -> mmap.mmap:
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # Small pages: a huge page here would be copied whole (2 MiB) when the zygote writes
        # output into it while a child shares it, and split by every wipe.
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
        return buffer

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` bytes from an empty buffer; a larger mapping if it lacks it (the
        caller accounts for the difference in ``size``)."""
        if self.used:
            raise RuntimeError("payload buffer still in use")
        if needed <= self.size:
            return
        self._view.release()
        with contextlib.suppress(BufferError):  # a view still held: freed when it goes
            self._map.close()
        self.size = _round_up(needed + SLACK)
        self._map = self._new(self.size)
        self._view = memoryview(self._map)

    def take(self, n: int) -> memoryview:
        """The next ``n`` bytes of the buffer."""
        if self.used + n > self.size:
            raise RuntimeError(f"payload buffer of {self.size} bytes cannot take {n} more")
        view = self._view[self.used : self.used + n]
        self.used += n
        return view

    def wipe(self) -> None:
        """Zero every byte used, and start again from the beginning. Private anonymous pages
        dropped read back as zeros: one system call, whatever the size, and pages that were
        reserved but never written (most of the output buffers) are not touched."""
        if self.used:
            self._map.madvise(mmap.MADV_DONTNEED, 0, _round_up(self.used))
        self.used = 0


def receive(sock: socket.socket, buffer: Payload, room: int) -> dict[str, Any] | None:
    """The next message with its payload fields as views into ``buffer`` (which also keeps
    ``room`` bytes free for the result), or None when the peer closed the connection."""
    message = protocol.recv_header(sock)
    if message is None:
        return None
    sizes = protocol.payload_sizes(message)
    buffer.reserve(sum(size for _, size in sizes) + room)
    for name, size in sizes:
        view = buffer.take(size)
        if size and not protocol.recv_into_exactly(sock, view):
            raise protocol.ProtocolError("peer closed the connection mid-frame")
        message[name] = view
    return message
