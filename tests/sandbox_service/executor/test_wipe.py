"""The scratch directories' wipe: whatever tree a program left, removed without recursion,
as root and as the program's own user; what cannot be removed is reported, never raised past
the reset (the zygote then recycles itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_service
from sandbox_service.executor import wipe
from sandbox_service.executor.workdir import Reset, Scratch

# Builds the tree of every shape the wipe must survive, in the current directory.
BUILD = r"""
import os
fd = os.open('.', os.O_RDONLY)
for i in range(5000):
    os.mkdir('d', dir_fd=fd)
    inner = os.open('d', os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
os.close(fd)
os.mkdir(b'\xff\xfe'); open(b'\xff\xfe/\x80', 'w').close()
os.makedirs('locked/inner/x'); open('locked/inner/f', 'w').close()
os.chmod('locked/inner', 0); os.chmod('locked', 0)
os.symlink('/etc', 'link'); os.mkfifo('fifo')
os.mkdir('.wipe-0'); os.mkdir('.wipe-1'); open('.wipe-1/a', 'w').close()
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    """On a tmpfs, as the private /tmp is; readable by nobody."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="wipe-", dir=base))
    path.chmod(0o755)
    yield path
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def _as_nobody(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    package_parent = os.path.dirname(os.path.dirname(sandbox_service.__file__))
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         "/usr/bin/python3", "-c", f"import sys; sys.path.insert(0, {package_parent!r})\n" + code],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_every_shape_is_removed_as_root(scratch: Path) -> None:
    subprocess.run([sys.executable, "-c", BUILD], cwd=scratch, check=True)
    wipe.empty_directory(str(scratch))
    assert os.listdir(scratch) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_every_shape_is_removed_as_its_owner(scratch: Path) -> None:
    """Without root the wipe obeys modes too: it opens what the program closed."""
    os.chown(scratch, 65534, 65534)
    done = _as_nobody(BUILD + "\nfrom sandbox_service.executor import wipe\n"
                      f"wipe.empty_directory({str(scratch)!r})\nprint(os.listdir('.'))", scratch)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "[]\n", done.stderr[-2000:]


def test_kept_entries_stay(scratch: Path) -> None:
    (scratch / "venv" / "lib").mkdir(parents=True)
    (scratch / "gone" / "x").mkdir(parents=True)
    wipe.empty_directory(str(scratch), frozenset({"venv"}))
    assert os.listdir(scratch) == ["venv"] and os.listdir(scratch / "venv") == ["lib"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_what_cannot_be_removed_is_reported_not_raised(scratch: Path) -> None:
    """A file of another user in a sticky directory: its owner's wipe cannot remove it. The
    wipe says so; the reset returns why (the zygote recycles itself), whatever the error."""
    os.chown(scratch, 65534, 65534)
    sticky = scratch / "sticky"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    (sticky / "roots").write_text("x")
    code = (
        "from sandbox_service.executor import wipe\n"
        "from sandbox_service.executor.workdir import Reset, Scratch\n"
        f"why = Reset([Scratch({str(scratch)!r})]).run()\n"
        "print(why)\n"
        f"try:\n    wipe.empty_directory({str(scratch)!r})\n"
        "except wipe.WipeIncomplete as exc:\n    print('incomplete', exc)\n"
    )
    done = _as_nobody(code, scratch)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.splitlines()
    assert "WipeIncomplete" in first and "entries left" in first, first
    assert second.startswith("incomplete"), second


def test_a_reset_never_raises(scratch: Path) -> None:
    """Not even for a scratch directory that vanished: it is reported."""
    why = Reset([Scratch(str(scratch / "missing"))]).run()
    assert why is not None and "FileNotFoundError" in why
    assert Reset([Scratch(str(scratch))]).run() is None
