"""A real Redis for the tests of Redis mode: a ``redis-server`` of our own on a free port.

Without the binary, ``REDIS_URL`` names a server to use instead; then every test works under
its own key prefix (as they always do) and nothing is ever flushed, and the tests that stop
and restart Redis are skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_service import service_process


class RedisServer(service_process.RedisServer):
    """Ours (``own``), or the one ``REDIS_URL`` names, which is never stopped."""

    def __init__(self, directory: Path, url: str | None = None, **options: Any) -> None:
        super().__init__(str(directory), **options)
        self.own = url is None
        self.url = url or self.url


def redis_servers(directory: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        url = os.environ.get("REDIS_URL")
        if not url:
            pytest.skip("needs redis-server on PATH or REDIS_URL")
        yield RedisServer(directory, url)
        return
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
