"""Class 7 of issue 21, ``files``: keys that cannot all be written are the caller's fault (a
422 naming the field), on every front, never an ``internal_error`` of the sandbox.

A session's files and a later cell's that collide are merged as writing the later over the
earlier would (the cell's win).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.slots import attacked_service, every_zygote_is_clean

X = base64.b64encode(b"x").decode()
COLLIDING = {
    "a file and a file under it": ["a", "a/b"],
    "deeper": ["a/b", "a/b/c/d"],
    "the same file twice": ["a", "./a"],
    "the same file, another spelling": ["d/a", "d//a"],
    "a directory spelled with a slash": ["a/", "a/b"],
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SandboxClient, str]]:
    with attacked_service(str(tmp_path_factory.mktemp("files"))) as pair:
        yield pair


@pytest.mark.parametrize("paths", COLLIDING.values(), ids=list(COLLIDING))
def test_colliding_paths_are_a_422_naming_the_field(
    paths: list[str], service: tuple[SandboxClient, str]
) -> None:
    client, url = service
    files = {p: X for p in paths}
    native = httpx.post(f"{url}/v1/execute", json={"code": "print(1)", "files": files})
    assert native.status_code == 422, native.text
    [error] = native.json()["detail"]
    assert error["loc"] == ["body", "files"] and paths[-1] in error["msg"], error
    batch = {"requests": [{"code": "print(1)"}, {"code": "print(2)", "files": files}]}
    in_batch = httpx.post(f"{url}/v1/execute/batch", json=batch)
    assert in_batch.status_code == 422
    assert in_batch.json()["detail"][0]["loc"][:4] == ["body", "requests", 1, "files"]
    fusion = httpx.post(f"{url}/run_code", json={"code": "print(1)", "language": "python",
                                                 "files": files})  # fmt: skip
    assert fusion.json()["status"] != "Success" and "files" in fusion.text, fusion.text
    assert "internal" not in fusion.text.lower()
    every_zygote_is_clean(client)


def test_a_session_cell_whose_files_collide_with_earlier_ones_runs(
    service: tuple[SandboxClient, str],
) -> None:
    client, url = service
    # Only the names this test writes: from a checkout under /tmp, the interpreter's own
    # directory stays visible in the private /tmp (docs/SECURITY.md), with thousands of files.
    code = (
        "import os\n"
        "def files(top):\n"
        "    if not os.path.isdir(top): return [top]\n"
        "    return [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]\n"
        "print(sorted(p for top in ('a', 'k') if os.path.lexists(top) for p in files(top)))"
    )
    session = {"session_id": "files-collide", "code": code}
    first = httpx.post(f"{url}/v1/execute", json={**session, "files": {"a": X, "k": X}}).json()
    assert first["status"] == "ok", first
    second = httpx.post(f"{url}/v1/execute", json={**session, "files": {"a/b": X}}).json()
    assert second["status"] == Status.ok.value, second
    assert second["stdout"] == "['a/b', 'k']\n", second
    every_zygote_is_clean(client)
