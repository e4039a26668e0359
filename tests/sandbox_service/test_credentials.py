"""The service's credential files (every ``*_file`` setting: API keys, the Redis password, its
TLS key) are out of an execution's reach whatever their mode: the mount layer covers each
with an empty file of mode 0; without it a zygote refuses to start while the slot uid could
read one, and says so in /readyz.

The files live outside /tmp, /root, /home and /run (which the mount layer hides whole), the
Redis password as a Kubernetes Secret mounts it: a link into a dated directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from sandbox_service.executor.pool import zygote_config
from sandbox_service.executor.startup import Confinement, check_secrets_hidden
from sandbox_service.service_process import start
from sandbox_service.settings import Settings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="slot uids and mounts need root")
SECRET = "credential-that-must-not-leak"
READ_ALL = """
import sys
for path in sys.argv_paths:
    try:
        print(path, repr(open(path).read()))
    except OSError as exc:
        print(path, type(exc).__name__)
"""


@pytest.fixture
def secrets() -> Iterator[dict[str, str]]:
    """Settings naming credential files, each world-readable (mode 0644), as podman mounts a
    Secret whatever its defaultMode."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-test-secrets-", dir="/var/lib"))
    root.chmod(0o755)
    dated = root / "redis" / "..2026_12_05_10_00_00.1"
    dated.mkdir(parents=True)
    (dated / "password").write_text(SECRET)
    (root / "redis" / "..data").symlink_to(dated.name)
    (root / "redis" / "password").symlink_to("..data/password")
    (root / "tls.key").write_text(SECRET)
    for path in (dated / "password", root / "tls.key"):
        path.chmod(0o644)
    for folder in (root / "redis", dated):
        folder.chmod(0o755)
    try:
        yield {"redis_password_file": str(root / "redis" / "password"),
               "redis_tls_key_file": str(root / "tls.key"), "root": str(root)}  # fmt: skip
    finally:
        shutil.rmtree(root)


def read_from_execution(url: str, paths: list[str]) -> str:
    code = READ_ALL.replace("sys.argv_paths", repr(paths))
    result = httpx.post(f"{url}/v1/execute", json={"code": code}, timeout=60).json()
    assert result["status"] == "ok", result
    return str(result["stdout"])


def every_path(secrets: dict[str, str]) -> list[str]:
    root = Path(secrets["root"])
    return [secrets["redis_password_file"], secrets["redis_tls_key_file"],
            str(next((root / "redis").glob("..2026*")) / "password")]  # fmt: skip


def test_hidden_by_the_mount_layer(tmp_path: Path, secrets: dict[str, str]) -> None:
    service = start(str(tmp_path / "service.log"), slots=1, light_zygote=False, preload="math",
                    redis_password_file=secrets["redis_password_file"],
                    redis_tls_key_file=secrets["redis_tls_key_file"])  # fmt: skip
    try:
        said = read_from_execution(service.url, every_path(secrets))
        assert SECRET not in said
        assert said.count("PermissionError") == 3, said
    finally:
        service.stop()


def test_without_the_mount_layer_readable_ones_stop_the_start(
    tmp_path: Path, secrets: dict[str, str]
) -> None:
    service = start(str(tmp_path / "service.log"), wait_for="/healthz", slots=1,
                    light_zygote=False, preload="math", disable_isolation="mount",
                    redis_password_file=secrets["redis_password_file"])  # fmt: skip
    try:
        ready = httpx.get(f"{service.url}/readyz", timeout=10)
        assert ready.status_code == 503, ready.text
        reason = ready.json()["reason"]
        # "slot uid N can read" where the uid layer holds; here, without the mount layer,
        # Python under /root keeps slot uids out: "uid 0 (no slot uid here) can read"
        assert "zygote cannot start: credentials: " in reason and "(mode 0644)" in reason, reason
        assert "..2026_12_05_10_00_00.1/password" in reason, reason
    finally:
        service.stop()


def test_without_the_mount_layer_root_only_ones_pass(secrets: dict[str, str]) -> None:
    """The start-up check itself (a probe as the slot uid, forked), for a host whose Python
    slot uids can read without the mount layer: a file of mode 0400 passes, 0644 does not."""
    config = zygote_config(Settings(), 0, uid_base=2_999_000)
    config = replace(config, secret_files=[secrets["redis_password_file"]])
    confinement = Confinement(uid=True)
    with pytest.raises(PermissionError, match=r"slot uid 2999000 can read .*\(mode 0644\)"):
        check_secrets_hidden(config, confinement)
    for path in every_path(secrets):
        os.chmod(path, 0o400)
    check_secrets_hidden(config, confinement)
