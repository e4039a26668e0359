"""Fixtures for the tests of Redis mode: a Redis of the session, one of a test's own, and a
key prefix per test (``redis_helpers`` says where the Redis comes from)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox_service.redis_helpers import RedisServer, redis_servers


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis for the session; tests keep apart by key prefix."""
    yield from redis_servers(tmp_path_factory.mktemp("redis"))


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis this test alone uses, and may stop and restart."""
    for server in redis_servers(tmp_path):
        if not server.own:
            pytest.skip("stops and restarts Redis: needs redis-server on PATH")
        yield server


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing a Redis never see each other."""
    return f"test-{uuid.uuid4().hex[:8]}"
