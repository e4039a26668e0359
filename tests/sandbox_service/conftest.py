"""A real Redis for the tests of Redis mode: a ``redis-server`` of our own on a free port.

Without the binary, ``REDIS_URL`` names a server to use instead; then every test works under
its own key prefix (as they always do) and nothing is ever flushed, and the tests that stop
and restart Redis are skipped.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_service import launch


class RedisServer(launch.RedisServer):
    """Ours (``own``), or the one ``REDIS_URL`` names, which is never stopped."""

    def __init__(self, directory: Path, url: str | None = None, **options: Any) -> None:
        super().__init__(str(directory), **options)
        self.own = url is None
        self.url = url or self.url


def _server(directory: Path) -> Iterator[RedisServer]:
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


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis for the session; tests keep apart by key prefix."""
    yield from _server(tmp_path_factory.mktemp("redis"))


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis this test alone uses, and may stop and restart."""
    for server in _server(tmp_path):
        if not server.own:
            pytest.skip("stops and restarts Redis: needs redis-server on PATH")
        yield server


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing a Redis never see each other."""
    return f"test-{uuid.uuid4().hex[:8]}"
