"""Frames between a slot (in the service) and its zygote: 4-byte length, then a JSON object.

Both directions carry plain dicts: ``{"op": "run", ...}`` requests and result dicts. The zygote
side is blocking; the slot side works on asyncio streams (duck-typed, so the zygote never
imports asyncio).
"""

from __future__ import annotations

import socket
from typing import Any

import orjson

MAX_FRAME = 256 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a frame, or went away mid-frame."""


def encode(message: dict[str, Any]) -> bytes:
    payload = orjson.dumps(message)
    return len(payload).to_bytes(4, "big") + payload


def _decode_length(header: bytes) -> int:
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return size


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise ProtocolError("peer closed the connection mid-frame")
        got += n
    return bytes(buf)


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None when the peer closed the connection cleanly."""
    header = _recv_exactly(sock, 4)
    if header is None:
        return None
    payload = _recv_exactly(sock, _decode_length(header))
    if payload is None:
        raise ProtocolError("peer closed the connection mid-frame")
    return orjson.loads(payload)


async def read_message(reader: Any) -> dict[str, Any]:
    """Read one message from an asyncio StreamReader; IncompleteReadError on EOF."""
    header = await reader.readexactly(4)
    return orjson.loads(await reader.readexactly(_decode_length(header)))
