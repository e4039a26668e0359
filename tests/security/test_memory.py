"""Class 3 of issue 21: ``memory_mb`` limits an execution as a whole, every process it starts
together, and ``peak_memory_mb`` is the whole tree's.

Where the host has a memory cgroup controller each zygote has a cgroup of its own
(``executor.memory``); every attack runs on full and light zygotes, and after each every
zygote of every slot must answer a clean probe (``slots.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.executor.memory import memory_cgroup
from sandbox_service.models import Status
from tests.security.slots import attacked_service, every_zygote_is_clean

FORKS = """
import os, time
pids = []
for _ in range({n}):
    pid = os.fork()
    if pid == 0:
        block = bytearray({mb} << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep({hold})
        os._exit(0)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
print('children ended', codes)
"""

POOL = """
import multiprocessing as mp, time
def hog(_):
    block = bytearray(60 << 20)
    block[::4096] = b'x' * len(block[::4096])
    time.sleep(0.5)
    return len(block)
with mp.Pool(6) as pool:
    print(sum(pool.map(hog, range(6))))
"""

TMPFS_AND_HEAP = """
import os
with open('/tmp/ballast', 'wb') as f:  # tmpfs pages are memory too
    for _ in range(60):
        f.write(b'x' * (1 << 20))
block = bytearray(90 << 20)
block[::4096] = b'x' * len(block[::4096])
print('held 150 MiB')
"""

SHM_AND_CHILDREN = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0, 60 << 20, 0o1000 | 0o600)
addr = libc.shmat(shm, None, 0)
ctypes.memset(addr, 1, 60 << 20)
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(50 << 20); block[::4096] = b'x' * len(block[::4096]); time.sleep(1)
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
print('shm and children')
"""

OVER = {
    "ten forked children of 110 MiB": FORKS.format(n=10, mb=110, hold=1),
    "a multiprocessing pool": POOL,
    "a tmpfs file and the heap": TMPFS_AND_HEAP,
    "SysV shared memory and children": SHM_AND_CHILDREN,
}
KINDS = {"full": "import numpy\n", "light": ""}
CGROUP_ONLY = ("a tmpfs file and the heap", "SysV shared memory and children")


@pytest.fixture(scope="module", params=["cgroup", "sampled"])
def client(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:  # fmt: skip
    """The cgroup where the host has one, and the sampled tree (the fallback) everywhere."""
    if request.param == "cgroup":
        try:
            memory_cgroup()  # what the service needs, asked of the host, not of the service
        except OSError as exc:
            pytest.skip(f"no memory cgroup controller here: {exc}")
        if os.geteuid() != 0:
            pytest.skip("a cgroup per slot needs root")
    settings = {"disable_isolation": "memory"} if request.param == "sampled" else {}
    with attacked_service(str(tmp_path_factory.mktemp("memory")), **settings) as (c, _):
        assert c.status().isolation["memory"] is (request.param == "cgroup")
        yield c


def _cgroup_only(attack: str, client: SandboxClient) -> None:
    """Pages of a tmpfs or of shared memory are in no process's private memory: only a
    cgroup counts them."""
    if client.status().isolation["memory"] is not True and attack in CGROUP_ONLY:
        pytest.skip("counted by the cgroup only")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attack", OVER)
def test_processes_together_are_held_to_the_limit(attack: str, kind: str,
                                                  client: SandboxClient) -> None:  # fmt: skip
    _cgroup_only(attack, client)
    result = client.execute(KINDS[kind] + OVER[attack], memory_mb=128, timeout_s=30)
    assert result.status is Status.memory_limit, (result.status, result.stdout, result.message)
    if client.status().isolation["memory"] is True:  # a sample may see it beyond the limit
        assert result.peak_memory_mb <= 128 + 1, result.peak_memory_mb
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_over_between_two_samples(kind: str, client: SandboxClient) -> None:
    """Past the limit and out again (an exit of its own) faster than the sampler looks: the
    kernel's high-water mark of the process says it went over, as the cgroup's kill does."""
    burst = "import sys\nx = [b'x' * (100 << 20) for _ in range(2)]\nsys.exit(1)"
    result = client.execute(KINDS[kind] + burst, memory_mb=128)
    assert result.status is Status.memory_limit, (result.status, result.message)
    assert result.peak_memory_mb > 120, result.peak_memory_mb  # the cgroup's stops at 128
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_the_peak_is_the_trees(kind: str, client: SandboxClient) -> None:
    """Four children of 40 MiB at once under 512: ok, and the peak counts all four (one
    process's maximum, which the service used to report, is ~40)."""
    result = client.execute(KINDS[kind] + FORKS.format(n=4, mb=40, hold=1), memory_mb=512)
    assert result.status is Status.ok, (result.status, result.stderr[-300:])
    assert 160 <= result.peak_memory_mb < 512, result.peak_memory_mb
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_within_the_limit_is_ok(kind: str, client: SandboxClient) -> None:
    """The limit is on what the execution adds, not on the preloaded interpreter it shares."""
    big = "block = bytearray(100 << 20)\nblock[::4096] = b'x' * len(block[::4096])\nprint('ok')"
    result = client.execute(KINDS[kind] + big, memory_mb=128)
    assert result.status is Status.ok, (result.status, result.message, result.stderr[-300:])
    if client.status().isolation["memory"] is True:  # a sample is too slow to see it
        trivial = client.execute(KINDS[kind] + "print(1)")
        assert trivial.peak_memory_mb < 64, trivial.peak_memory_mb
    every_zygote_is_clean(client)
