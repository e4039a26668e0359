"""Class 2 of issue 21: SysV IPC and POSIX message queues are neither shared with the host
or other slots nor kept from one execution to the next.

Each zygote has an IPC namespace of its own, emptied after every execution. An attack plants
objects (or looks for the host's), a second program looks for them from every zygote, and
then every zygote must answer a clean probe (``slots.py``). Each runs on full and light
zygotes alike.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.every_slot import full_prefix, light_prefix, suite_slots
from tests.security.slots import attacked_service, every_zygote_is_clean

IPC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
KEY = 0x21AB

class MqAttr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long),
                ('msgsize', ctypes.c_long), ('cur', ctypes.c_long), ('pad', ctypes.c_long * 4)]

class Msg(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('text', ctypes.c_char * 64)]
"""

PLANT = {
    "shared memory segment": """
shm = libc.shmget(KEY, 1 << 20, IPC_CREAT | 0o666)
assert shm >= 0, ctypes.get_errno()
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b'SECRET-SHM', 10)
print('planted')
""",
    "semaphore set": """
assert libc.semget(KEY, 4, IPC_CREAT | 0o666) >= 0, ctypes.get_errno()
print('planted')
""",
    "message queue (SysV)": """
q = libc.msgget(KEY, IPC_CREAT | 0o666)
assert q >= 0, ctypes.get_errno()
m = Msg(1, b'SECRET-MSG')
assert libc.msgsnd(q, ctypes.byref(m), 64, 0) == 0, ctypes.get_errno()
print('planted')
""",
    "POSIX message queue": """
attr = MqAttr(0, 4, 64, 0)
q = libc.mq_open(b'/sbx-planted', os.O_CREAT | os.O_RDWR, 0o666, ctypes.byref(attr))
assert q >= 0, ctypes.get_errno()
assert libc.mq_send(q, b'SECRET-MQ', 9, 0) == 0, ctypes.get_errno()
print('planted')
""",
}

# Prints FOUND and what it read if anything planted (or the host's) is reachable.
LOOK = """
found = []
for kind in ('shm', 'sem', 'msg'):
    with open('/proc/sysvipc/' + kind) as f:
        rows = f.read().splitlines()[1:]
    found += [kind + ': ' + ' '.join(r.split()[:3]) for r in rows]
for get, args in ((libc.shmget, (KEY, 0, 0)), (libc.semget, (KEY, 0, 0)), (libc.msgget, (KEY, 0))):
    if get(*args) >= 0:
        found.append(f'key {KEY:#x} via {get.__name__}')
if libc.shmget(HOST_KEY, 0, 0) >= 0:
    found.append('the host segment')
q = libc.mq_open(b'/sbx-planted', os.O_RDONLY)
if q >= 0:
    found.append('the POSIX queue')
for name in ('/dev/mqueue',):
    if os.path.isdir(name) and os.listdir(name):
        found.append(name + ': ' + str(os.listdir(name)))
print('FOUND' if found else 'NOTHING', found)
"""
KINDS = {"full": full_prefix(suite_slots()), "light": light_prefix(suite_slots())}
HOST_KEY = 0x21AC


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    with attacked_service(str(tmp_path_factory.mktemp("ipc"))) as (c, _):
        if os.geteuid() != 0:
            pytest.skip("an IPC namespace per slot needs root")
        yield c


@pytest.fixture(scope="module")
def host_segment() -> Iterator[int]:
    """A segment of the host's own (the service's namespace), which no execution may see."""
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(HOST_KEY, 4096, 0o1000 | 0o666)
    assert shm >= 0, os.strerror(ctypes.get_errno())
    yield shm
    libc.shmctl(shm, 0, None)


def _look_everywhere(client: SandboxClient) -> list[str]:
    """Run the look-up on every zygote of every slot at once; what each found."""
    n = len(client.status().slots)
    look = IPC + f"HOST_KEY = {HOST_KEY}\n" + LOOK
    batch = [full_prefix(n) + look] * n + [light_prefix(n) + look] * n
    results = client.execute_batch(batch)
    assert all(r.status is Status.ok for r in results), [r.stderr[-300:] for r in results]
    return [r.stdout for r in results if not r.stdout.startswith("NOTHING")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plant", PLANT)
def test_what_one_execution_leaves_nobody_finds(plant: str, kind: str, client: SandboxClient,
                                                host_segment: int) -> None:  # fmt: skip
    planted = client.execute(KINDS[kind] + IPC + PLANT[plant])
    assert planted.stdout == "planted\n", (planted.status, planted.stderr[-500:])
    assert _look_everywhere(client) == []
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_a_running_execution_is_invisible_to_the_other_slots(kind: str,
                                                             client: SandboxClient) -> None:  # fmt: skip
    """While one execution holds every kind of object, the other zygotes see none of them."""
    holder = KINDS[kind] + IPC + "".join(PLANT.values()) + "import time; time.sleep(3)\n"
    look = IPC + f"HOST_KEY = {HOST_KEY}\nimport time; time.sleep(0.5)\n" + LOOK
    n = len(client.status().slots)
    results = client.execute_batch([holder] + [full_prefix(n) + look, light_prefix(n) + look] * n)
    assert results[0].stdout.count("planted") == len(PLANT), results[0].stderr[-500:]
    assert [r.stdout[:7] for r in results[1:]] == ["NOTHING"] * 2 * n, [r.stdout for r in results]
    every_zygote_is_clean(client)


@pytest.mark.parametrize("kind", KINDS)
def test_shared_memory_is_bounded(kind: str, client: SandboxClient) -> None:
    """A namespace's own shmmax/shmall: no segment of 1 GiB (held beyond any rlimit)."""
    big = IPC + (
        "shm = libc.shmget(0x21AD, 1 << 30, IPC_CREAT | 0o600)\n"
        "print('refused' if shm < 0 else 'GOT 1 GiB')\n"
    )
    result = client.execute(KINDS[kind] + big)
    assert result.stdout == "refused\n", (result.status, result.stdout, result.stderr[-300:])
    every_zygote_is_clean(client)


def test_isolation_reports_the_ipc_layer(client: SandboxClient) -> None:
    assert client.status().isolation["ipc"] is True
