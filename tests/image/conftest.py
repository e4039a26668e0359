"""tests/image: the image built by `make image`, run for real on a Docker engine.

`make test-image` runs them (and fails where no engine answers or the image is missing); in
the main suite they run where both are there and are otherwise skipped, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.engine import REQUIRED, Engine, engine, why_not
from tests.image.test_shapes import PASSWORD, Secret

REASON = why_not()


@pytest.fixture(autouse=True)
def _engine_and_image() -> None:
    if REASON is None:
        return
    if REQUIRED:
        pytest.fail(f"the image tests cannot run: {REASON}")
    pytest.skip(f"the image tests need a Docker engine and the image: {REASON}")


@pytest.fixture
def docker_engine() -> Iterator[Engine]:
    yield from engine()


@pytest.fixture
def secret(tmp_path: Path) -> Secret:
    out = Secret(tmp_path / "root-only", tmp_path / "readable")
    for folder, mode in ((out.root_only, 0o400), (out.readable, 0o444)):
        folder.mkdir()
        folder.chmod(0o755)
        (folder / "password").write_text(PASSWORD)
        (folder / "password").chmod(mode)
    return out
