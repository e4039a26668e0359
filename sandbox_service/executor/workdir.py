"""Where each execution of a zygote works, and leaving nothing of it for the next.

With the mount layer the working directory is the zygote's private ``/tmp``; without it, a
fresh run directory under the slot's own directory in ``work_root``. What an execution can
leave is files (the slot's private ``/tmp`` and ``/dev/shm``, or its run directory without
the mount layer) and IPC objects (``executor.ipc``). The reset removes both
once every process of the execution is dead, and says whether it succeeded; it never raises,
whatever the program made (``RecursionError`` from a deep tree included), because a zygote
that cannot prove it is clean must be recycled, never reused (go-judge's rule).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox_service.executor import ipc, wipe

if TYPE_CHECKING:  # Reset runs where only the standard library is (tests/.../test_wipe.py)
    from sandbox_service.executor.protocol import ZygoteConfig

SCRATCH_MODE = 0o1777  # root-owned and sticky, like a host's /tmp
SHM_MB = 64


@dataclass(frozen=True)
class Scratch:
    """A directory emptied after every execution, what in it to keep, and its mode."""

    path: str
    keep: frozenset[str] = frozenset()
    mode: int | None = None  # restored after emptying (the program may have changed it)
    remove: bool = False  # the directory itself goes too (a run directory)


@dataclass
class Reset:
    """What to clean after each execution of one zygote."""

    scratch: list[Scratch] = field(default_factory=list)
    ipc: bool = False  # the zygote has an IPC namespace of its own to empty
    mq_fd: int | None = None

    def run(self, extra: tuple[Scratch, ...] = ()) -> str | None:
        """Clean up; None if nothing of the execution is left, else why not."""
        problems: list[str] = []
        for item in [*self.scratch, *extra]:
            try:
                if item.remove:
                    wipe.remove_tree(item.path)
                    continue
                wipe.empty_directory(item.path, item.keep)
                if item.mode is not None:
                    os.chmod(item.path, item.mode)
            except Exception as exc:  # whatever it is, the zygote is not clean
                problems.append(f"{item.path}: {type(exc).__name__}: {exc}")
        if self.ipc:
            try:
                ipc.remove_all(self.mq_fd)
            except Exception as exc:
                problems.append(f"IPC: {type(exc).__name__}: {exc}")
        return "; ".join(problems)[:1000] or None


def scratch_dirs(config: ZygoteConfig) -> list[tuple[str, int]]:
    """The writable places of a slot with a mount namespace, and their sizes in MiB."""
    return [("/tmp", config.tmpfs_mb), ("/dev/shm", min(SHM_MB, config.tmpfs_mb))]


def make_work_root(path: str) -> None:
    """Create ``path`` if missing as a host's /tmp is made (everyone may add, sticky), so that
    services of other users can later put their slot directories beside ours."""
    if not os.path.isdir(path):
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another slot made it meanwhile
            os.mkdir(path)
            os.chmod(path, SCRATCH_MODE)  # mkdir's mode is masked by the umask
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(
            f"work_root {path} is not writable by uid {os.getuid()} (made by another user "
            "without the sticky mode 1777?): choose another --work-root"
        )


def slot_dir(config: ZygoteConfig) -> str:
    """This slot's directory under work_root when there is no private /tmp. Several services
    may share a host and a work_root: named by the slot's uid (no two live services share
    one) or, without one, by the service's pid."""
    name = f"slot-{config.uid}" if config.uid is not None else f"slot-{os.getppid()}-{config.slot}"
    return os.path.join(config.work_root, name)


def prepare_slot_dir(config: ZygoteConfig) -> None:
    """Without the mount layer, at start: an empty directory of the slot's own under work_root.
    A predecessor killed mid-run (SIGKILL, OOM) left its run directory behind, and ours start
    from run-1 again: the slot's directory is ours alone, so empty it first."""
    own = slot_dir(config)
    with contextlib.suppress(OSError, wipe.WipeIncomplete):  # what stays is not reused
        wipe.remove_tree(own)
    make_work_root(config.work_root)
    os.makedirs(own, mode=0o711, exist_ok=True)


class WorkDirs:
    """One zygote's working directories: made before each execution, reset after it."""

    def __init__(self, config: ZygoteConfig, *, private_tmp: bool, own_uid: bool,
                 scratch_keep: dict[str, frozenset[str]], ipc: bool, mq_fd: int | None,
                 run_tag: str) -> None:  # fmt: skip
        """``private_tmp``: the mount layer's /tmp is the working directory; ``own_uid``: code
        runs as the slot's uid, which must own a run directory; ``scratch_keep``: what to keep
        in each scratch directory; ``run_tag``: names run directories apart from those of
        another zygote of the slot."""
        self.config = config
        self.private_tmp = private_tmp
        self.own_uid = own_uid
        self.run_tag = run_tag
        self.runs = 0
        self.reset = Reset(
            scratch=[Scratch(path, scratch_keep.get(path, frozenset()), SCRATCH_MODE)
                     for path, _ in scratch_dirs(config)] if private_tmp else [],
            ipc=ipc,
            mq_fd=mq_fd,
        )  # fmt: skip

    def make(self) -> str:
        """The next execution's working directory."""
        self.runs += 1
        if self.private_tmp:
            return "/tmp"
        # The zygote's tag in the name: what a predecessor could not remove never collides.
        path = os.path.join(slot_dir(self.config), f"run-{self.run_tag}-{self.runs}")
        os.makedirs(path, mode=0o700)
        uid = self.config.uid
        if self.own_uid and uid is not None:
            os.chown(path, uid, self.config.gid if self.config.gid is not None else uid)
        return path

    def clean(self, workdir: str) -> str | None:
        """Leave nothing of the execution that worked in ``workdir``; None if done, else why
        not (the zygote is then recycled)."""
        run_dir = () if self.private_tmp else (Scratch(workdir, remove=True),)
        return self.reset.run(run_dir)
