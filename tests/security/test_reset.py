"""Class 1 of issue 21: no tree a program leaves in its scratch directories breaks the slot or
reaches the next execution.

Each attack runs on a full zygote (it imports numpy) and on a light one (standard library
only); after each, every zygote of every slot must answer a clean probe (``slots.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.models import Status
from tests.security.slots import attacked_service, every_zygote_is_clean

DEEP = """
import os
os.chdir({where!r})
fd = os.open('.', os.O_RDONLY)
for i in range({depth}):
    os.mkdir('d', dir_fd=fd)
    inner = os.open('d', os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
    if i % 500 == 0:
        os.close(os.open('f', os.O_CREAT | os.O_WRONLY, dir_fd=fd))
print('deep', {depth})
"""

PLANT = """
for name in ('fractions', 'colorsys', 'json'):
    with open('/tmp/' + name + '.py', 'w') as f:
        f.write('print("PLANTED")\\n')
"""

LOCKED = """
import os
os.makedirs('/tmp/a/b/c/d')
for path in ('/tmp/a/b/c/d/file', '/tmp/a/b/file', '/dev/shm/x'):
    open(path, 'w').write('x')
for path in ('/tmp/a/b/c/d', '/tmp/a/b/c', '/tmp/a/b', '/tmp/a'):
    os.chmod(path, 0)
os.makedirs('/dev/shm/q/r'); os.chmod('/dev/shm/q/r', 0o500); os.chmod('/dev/shm/q', 0)
print('locked')
"""

NOT_UTF8 = """
import os
for name in (b'/tmp/\\xff\\xfe', b'/tmp/\\xc3(', b'/dev/shm/\\x80'):
    os.mkdir(name)
    open(name + b'/\\xe9t\\xe9', 'w').write('x')
    os.symlink(b'/etc', name + b'/\\x81link')
print('bytes')
"""

FULL_TMPFS = """
import os
chunk = b'x' * (1 << 20)
try:
    with open('/tmp/big', 'wb') as f:
        while True:
            f.write(chunk)
except OSError as exc:
    print('disk', exc.errno)
i = 0
try:
    while True:
        os.mkdir(f'/tmp/n{i}'); i += 1
except OSError as exc:
    print('inodes', exc.errno)
"""

ODD_KINDS = """
import os, socket
os.mkfifo('/tmp/fifo')
os.symlink('/tmp', '/tmp/loop')
os.symlink('/etc/passwd', '/dev/shm/passwd')
os.link('/tmp/fifo', '/tmp/fifo2')
os.makedirs('/tmp/.wipe-0/.wipe-1')
os.makedirs('/tmp/sticky/x'); os.chmod('/tmp/sticky', 0o1777)
a, b = socket.socketpair()
print('odd')
"""

ATTACKS = {
    "deep tree 1,200 levels in /tmp": DEEP.format(where="/tmp", depth=1200),
    "deep tree 12,000 levels in /tmp": DEEP.format(where="/tmp", depth=12000),
    "deep tree 3,000 levels in /dev/shm": DEEP.format(where="/dev/shm", depth=3000),
    "deep tree with planted modules": PLANT + DEEP.format(where="/tmp", depth=2000),
    "directories chmod 000": LOCKED,
    "names that are not UTF-8": NOT_UTF8,
    "full tmpfs": FULL_TMPFS,
    "fifos, links, lookalike names": ODD_KINDS,
}
KINDS = {"full": "import numpy\n", "light": ""}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    with attacked_service(str(tmp_path_factory.mktemp("reset")), tmpfs_mb=32) as (c, _):
        if c.status().isolation.get("mount") is not True:
            pytest.skip("no private /tmp (mount layer inactive)")
        yield c


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attack", ATTACKS)
def test_the_next_execution_finds_nothing(attack: str, kind: str, client: SandboxClient) -> None:
    result = client.execute(KINDS[kind] + ATTACKS[attack], timeout_s=60)
    assert result.status is Status.ok, (result.status, result.message, result.stderr[-500:])
    every_zygote_is_clean(client)


def test_the_slots_were_not_recycled_for_what_they_could_clean(client: SandboxClient) -> None:
    """Every tree above can be removed: a reset that only recycles would be slow and hide a
    bug. (A reset that fails recycles: tests/sandbox_service/executor/test_wipe.py.)"""
    status = client.status()
    zygotes = status.slots + status.light_slots
    assert zygotes and [z.restarts for z in zygotes] == [0] * len(zygotes)
