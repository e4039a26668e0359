"""A zygote's own IPC namespace, and removing what an execution left in it.

SysV shared memory, semaphores and message queues, and POSIX message queues, live in the IPC
namespace, not in any file system: outside one of its own, an execution lists and reads the
host's objects and those of every other slot, and what it creates outlives it, holding memory
no rlimit counts. Each zygote (full and light alike) enters a namespace of its own at start,
caps its shared memory there, and after every execution removes every object in it: the
namespace then holds only what the running execution made. Removing costs three small reads
of ``/proc/sysvipc`` (which shows the reader's own namespace) and one directory listing.

POSIX queues have no list call: the zygote mounts its namespace's ``mqueue`` file system
detached (``fsopen``/``fsmount``, Linux 5.2+), lists and unlinks through that descriptor, and
where the host has ``/dev/mqueue`` it covers that too, so the host's queue names are not shown.
"""

from __future__ import annotations

import ctypes
import os

from sandbox_service.executor import isolation as iso

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWIPC = 0x08000000
IPC_RMID = 0
AT_FDCWD = -100
PAGE = os.sysconf("SC_PAGE_SIZE")
SYSVIPC = {"shm": "shmctl", "sem": "semctl", "msg": "msgctl"}


class IpcLeft(Exception):
    """An IPC object of an execution could not be removed."""


def _check(ret: int, what: str) -> int:
    if ret < 0:
        raise iso.failure(ctypes.get_errno(), what)
    return ret


def _new_mqueue_mount() -> int:
    """A detached mount of the current IPC namespace's mqueue file system (a path fd)."""
    return iso.new_detached_mount("mqueue")


def enter_namespace(shm_mb: int) -> tuple[int, str | None]:
    """Unshare the IPC namespace, cap its shared memory at ``shm_mb`` in all, and return a
    descriptor of its POSIX message-queue file system (to list and remove queues), and why
    the cap could not be set, if so.

    In a container /proc/sys is read-only (runc: EROFS; gVisor: EIO): the namespace is still
    the zygote's own (no other slot sees its objects, all removed after each run), and its
    shared memory is bounded by the container's memory limit instead of the cap."""
    iso.unshare(CLONE_NEWIPC)
    # Per-namespace sysctls: a new namespace starts from the kernel's defaults (unlimited).
    uncapped = None
    try:
        with open("/proc/sys/kernel/shmall", "w") as f:
            f.write(str(shm_mb * (1 << 20) // PAGE))
        with open("/proc/sys/kernel/shmmax", "w") as f:
            f.write(str(shm_mb * (1 << 20)))
    except OSError as exc:
        uncapped = (
            f"shared memory not capped at {shm_mb} MiB (/proc/sys/kernel: {exc.strerror}): "
            "bounded by the container's memory limit"
        )
    mnt = _new_mqueue_mount()
    try:  # fsmount's descriptor is a path only; listing needs one opened for reading
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=mnt), uncapped
    finally:
        os.close(mnt)


def cover_dev_mqueue() -> None:
    """Show this namespace's queues at ``/dev/mqueue`` instead of the host's (if it exists);
    needs a mount namespace of the zygote's own."""
    if not os.path.isdir("/dev/mqueue"):
        return
    mnt = _new_mqueue_mount()
    try:
        move = _libc.syscall(iso.SYS_MOVE_MOUNT, mnt, b"", AT_FDCWD, b"/dev/mqueue",
                             iso.MOVE_MOUNT_F_EMPTY_PATH)  # fmt: skip
        _check(int(move), "move_mount /dev/mqueue")
    finally:
        os.close(mnt)


def _sysv_ids(kind: str) -> list[int]:
    lines = iso.read_small(f"/proc/sysvipc/{kind}").splitlines()[1:]
    return [int(line.split()[1]) for line in lines if line.strip()]


def remove_all(mq_fd: int | None) -> None:
    """Remove every SysV object and POSIX queue of the current IPC namespace; ``IpcLeft``
    naming what stayed. Only ever called when no process of the execution is alive."""
    left = []
    for kind, call in SYSVIPC.items():
        for ident in _sysv_ids(kind):
            # semctl takes a semnum before the command; the others do not.
            args = (ident, 0, IPC_RMID, None) if kind == "sem" else (ident, IPC_RMID, None)
            if getattr(_libc, call)(*args) != 0 and ctypes.get_errno() != 22:  # EINVAL: gone
                left.append(f"{kind} {ident}: {os.strerror(ctypes.get_errno())}")
    if mq_fd is not None:
        for name in os.listdir(mq_fd):
            try:
                os.unlink(name, dir_fd=mq_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                left.append(f"mqueue {name}: {exc}")
    if left:
        raise IpcLeft("IPC objects left: " + "; ".join(left[:5]))
