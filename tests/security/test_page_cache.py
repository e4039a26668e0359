"""Issue 30, class 2: page cache an earlier execution left in its zygote's memory cgroup does
not loosen the limit of later executions, and ``peak_memory_mb`` is each execution's own.

The attack reads host files after dropping them from the cache (``posix_fadvise``
``DONTNEED``), which charges every page it reads to the zygote's cgroup, where it stays after the
run. The limit used to be set to the cgroup's usage plus ``memory_mb``: every later execution of
that zygote could then use the cache's size more. One slot, so that both runs meet the same
zygote (full and light each); every zygote checked clean after.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.executor.memory import memory_cgroup
from sandbox_service.models import Status
from sandbox_service.service_process import start
from tests.security.every_slot import ZYGOTES
from tests.security.slots import every_zygote_is_clean

CHARGE_CACHE = """
import os
read = 0
for root, dirs, files in os.walk('/usr'):
    for name in files:
        try:
            fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while chunk := os.read(fd, 1 << 20):
                read += len(chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
        if read > {mb} << 20:
            print(read >> 20)
            raise SystemExit
print('only', read >> 20)
"""
# Three children of 100 MiB at once: over a limit of 128 MiB, within 128 + the cache.
CHILDREN = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        block = bytearray(100 << 20)
        block[::4096] = b'x' * len(block[::4096])
        time.sleep(1)
        os._exit(0)
for _ in range(3):
    os.wait()
print('three children of 100 MiB')
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    try:
        memory_cgroup()
    except OSError as exc:
        pytest.skip(f"no memory cgroup controller here: {exc}")
    if os.geteuid() != 0:
        pytest.skip("a cgroup per slot needs root")
    svc = start(str(tmp_path_factory.mktemp("cache") / "service.log"), slots=1,
                max_timeout_s=60, max_memory_mb=2048)  # fmt: skip
    try:
        with SandboxClient(svc.url, retry=Retry(attempts=1)) as c:
            assert c.status().isolation["memory"] is True
            yield c
    finally:
        svc.stop()


@pytest.mark.parametrize("cache_mb", [300, 600])
@pytest.mark.parametrize("zygote", list(ZYGOTES))
def test_cache_left_behind_gives_no_later_run_more(client: SandboxClient, zygote: str,
                                                   cache_mb: int) -> None:  # fmt: skip
    prefix = ZYGOTES[zygote]
    cached = client.execute(prefix + CHARGE_CACHE.format(mb=cache_mb), memory_mb=1024,
                            timeout_s=50)  # fmt: skip
    assert cached.status is Status.ok and not cached.stdout.startswith("only"), cached
    over = client.execute(prefix + CHILDREN, memory_mb=128, timeout_s=30)
    assert over.status is Status.memory_limit, (over.status, over.stdout, over.peak_memory_mb)
    assert over.peak_memory_mb <= 128 + 1, over.peak_memory_mb
    client.execute(prefix + CHARGE_CACHE.format(mb=cache_mb), memory_mb=1024, timeout_s=50)
    small = client.execute(prefix + "print(1)", memory_mb=128)
    assert small.status is Status.ok and small.peak_memory_mb < 32, small.peak_memory_mb
    every_zygote_is_clean(client)
