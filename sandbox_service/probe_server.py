"""A minimal HTTP responder for a few GET paths: worker nodes' probes and metrics, and the API
process's /metrics on a port of its own (``metrics_port``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Probe = Callable[[], Awaitable[tuple[int, str, bytes]]]


async def serve_probes(host: str, port: int, routes: Mapping[str, Probe]) -> asyncio.Server:
    """A minimal HTTP/1.1 responder for GETs of a few paths (no framework needed for three
    endpoints a scraper and a kubelet call)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)).strip():
                pass  # headers: not needed
            parts = line.split()
            path = parts[1].decode("latin-1").split("?")[0] if len(parts) > 1 else "/"
            route = routes.get(path)
            if route is None:
                code, ctype, body = 404, "application/json", b'{"detail": "not found"}'
            else:
                code, ctype, body = await route()
            head = (
                f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


def json_probe(code: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(body).encode()
