"""Frames between a slot (in the service) and its zygote: a JSON header, then raw payload bytes.

A frame is a 4-byte length, a JSON object (the header), then the bytes of its payload fields
(``code``, ``stdin``, ``files`` of a request; ``stdout``, ``stderr`` of a result), whose sizes
the header lists under ``"payload"``. Payload travels outside the JSON so that the zygote never
turns it into Python objects: it receives a request's payload into, and sends a result's from,
one buffer that it wipes after every execution (``payload.py``), since whatever stays in its
heap is copied into the next child by ``fork`` (issue 21, class 5).

The slot side works on asyncio streams (duck-typed, so the zygote never imports asyncio) and
sees plain dicts of str; the zygote side is blocking and sees memoryviews into its buffer.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import orjson

MAX_FRAME = 256 * 1024 * 1024
PAYLOAD = ("code", "stdin", "files", "stdout", "stderr")


class ProtocolError(Exception):
    """The peer sent something that is not a frame, or went away mid-frame."""


def _payload_bytes(name: str, value: Any) -> bytes | memoryview:
    if name == "files":
        return orjson.dumps(value)
    if isinstance(value, str):  # lone surrogates survive: the child decodes them back
        return value.encode("utf-8", "surrogatepass")
    return memoryview(value)


def _split(message: dict[str, Any]) -> tuple[bytes, list[bytes | memoryview]]:
    """(length and header, payload buffers) of ``message``."""
    header = {k: v for k, v in message.items() if k not in PAYLOAD}
    parts = [_payload_bytes(k, v) for k, v in message.items() if k in PAYLOAD]
    names = [k for k in message if k in PAYLOAD]
    if names:
        header["payload"] = [[name, len(part)] for name, part in zip(names, parts, strict=True)]
    encoded = orjson.dumps(header)
    return len(encoded).to_bytes(4, "big") + encoded, parts


def encode(message: dict[str, Any]) -> bytes:
    prefix, parts = _split(message)
    return b"".join([prefix, *parts])


def _decode_length(header: bytes) -> int:
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return size


def payload_sizes(header: dict[str, Any]) -> list[tuple[str, int]]:
    sizes = [(str(name), int(size)) for name, size in header.pop("payload", [])]
    if any(size < 0 for _, size in sizes) or sum(s for _, s in sizes) > MAX_FRAME:
        raise ProtocolError(f"payload sizes {sizes} out of range")
    return sizes


def decode_payload(name: str, data: bytes) -> Any:
    """A payload field as the slot side sees it: files a dict, the rest text."""
    if name == "files":
        return orjson.loads(data)
    if name in ("stdout", "stderr"):
        return data.decode("utf-8", errors="replace")
    return data.decode("utf-8", "surrogatepass")


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send without joining the payload into one bytes object (no copy of it in this heap)."""
    prefix, parts = _split(message)
    sendall_buffers(sock, [prefix, *parts])


def sendall_buffers(sock: socket.socket, buffers: Sequence[bytes | memoryview]) -> None:
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:64])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    if not recv_into_exactly(sock, memoryview(buf)):
        return None
    return bytes(buf)


def recv_into_exactly(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False if the peer closed before sending anything."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and len(view):
                return False
            raise ProtocolError("peer closed the connection mid-frame")
        got += n
    return True


def recv_header(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame's header (its payload still to be read), or None on a clean close."""
    length = _recv_exactly(sock, 4)
    if length is None:
        return None
    header = _recv_exactly(sock, _decode_length(length))
    if header is None:
        raise ProtocolError("peer closed the connection mid-frame")
    message: dict[str, Any] = orjson.loads(header)
    return message


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, payload decoded, or None when the peer closed the connection
    cleanly. (The zygote reads payload into its own buffer instead: ``payload.receive``.)"""
    message = recv_header(sock)
    if message is None:
        return None
    for name, size in payload_sizes(message):
        data = _recv_exactly(sock, size) if size else b""
        if data is None:
            raise ProtocolError("peer closed the connection mid-frame")
        message[name] = decode_payload(name, data)
    return message


async def read_message(reader: Any) -> dict[str, Any]:
    """Read one message from an asyncio StreamReader; IncompleteReadError on EOF."""
    header = await reader.readexactly(4)
    message: dict[str, Any] = orjson.loads(await reader.readexactly(_decode_length(header)))
    for name, size in payload_sizes(message):
        message[name] = decode_payload(name, await reader.readexactly(size))
    return message
