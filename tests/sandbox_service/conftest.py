"""A real Redis for the tests of Redis mode: a ``redis-server`` of our own on a free port.

Without the binary, ``REDIS_URL`` names a server to use instead; then every test works under
its own key prefix (as they always do) and nothing is ever flushed, and the tests that stop
and restart Redis are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_service.launch import free_port


class RedisServer:
    """A redis-server process that can be stopped and started again on the same port."""

    def __init__(self, directory: Path, url: str | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = url or f"redis://127.0.0.1:{self.port}/0"
        self.own = url is None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.own, "not our server"
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
            )
            if done.stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """SIGKILL, as a crash: the data (none is saved) is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


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
