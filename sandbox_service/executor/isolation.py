"""Linux confinement steps for the zygote and its children: namespaces, mounts, limits, uids.

Each function performs one step and raises ``OSError`` when the kernel refuses it. The zygote
tries the optional ones once at start-up and reports which are active; a child then applies
exactly those. Nothing here decides policy.

What this does not protect against: kernel exploits (use gVisor or a VM for that boundary),
side channels, and reading world-readable files of the host (system paths are visible,
read-only). See docs/SECURITY.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import time
from collections.abc import Callable, Collection

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000

MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (unified table, Linux 5.12+)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def failure(err: int, what: str) -> OSError:
    """``what`` failed with ``err``, named as a reader looks it up: "mount /: EINVAL (Invalid
    argument)"."""
    return OSError(err, f"{what}: {errno.errorcode.get(err, str(err))} ({os.strerror(err)})")


def _check(ret: int, what: str) -> None:
    if ret != 0:
        raise failure(ctypes.get_errno(), what)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def private_readonly_root() -> None:
    """In the caller's (new) mount namespace: stop propagation and make every mount read-only.

    One ``mount_setattr`` call covers the whole tree recursively, so /dev/shm, /var/tmp and every
    other writable place of the host become read-only for this namespace only.
    """
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    _set_readonly("/", recursive=True)


SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4


def _set_readonly(path: str, recursive: bool) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    ret = _libc.syscall(
        SYS_MOUNT_SETATTR, -100, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(int(ret), f"mount_setattr {path}")


def within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def kept_inside(path: str, keep: list[str]) -> list[str]:
    """The outermost ``keep`` directories within ``path`` (``path`` itself if it is kept)."""
    inside = sorted({k for k in keep if within(k, path) and os.path.isdir(k)})
    return [k for k in inside if not any(k != o and within(k, o) for o in inside)]


def cover(path: str, keep: list[str], *, size_mb: int = 1, mode: int = 0o755,
          writable: bool = False) -> list[str]:  # fmt: skip
    """Mount a fresh tmpfs over ``path``, except the ``keep`` paths inside it, which stay
    visible where they were (the interpreter may live in /root, or a venv in /tmp). Returns the
    kept paths inside ``path``. Read-only unless ``writable``. Uses the mount API (Linux
    5.2+) to carry the kept trees across the cover."""
    if not os.path.isdir(path):
        return []
    inside = kept_inside(path, keep)
    if path in inside:
        return inside  # the whole tree is needed: nothing to cover
    trees = []
    for k in inside:
        fd = _libc.syscall(SYS_OPEN_TREE, -100, k.encode(), OPEN_TREE_CLONE | AT_RECURSIVE)
        if fd < 0:
            _check(-1, f"open_tree {k}")
        trees.append((k, int(fd)))
    opts = f"size={size_mb}m,mode={mode:o},nr_inodes=65536"
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for k, fd in trees:
        os.makedirs(k, mode=0o755, exist_ok=True)
        ret = _libc.syscall(SYS_MOVE_MOUNT, fd, b"", -100, k.encode(), MOVE_MOUNT_F_EMPTY_PATH)
        os.close(fd)
        _check(int(ret), f"move_mount {k}")
    if not writable:
        _set_readonly(path, recursive=False)
    return inside


SYS_FSOPEN = 430
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
FSCONFIG_CMD_CREATE = 6
FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1


def _syscall_fd(ret: int, what: str) -> int:
    if ret < 0:
        raise failure(ctypes.get_errno(), what)
    return ret


def new_detached_mount(fstype: str) -> int:
    """A fresh instance of ``fstype`` mounted nowhere (``fsopen``/``fsmount``, Linux 5.2+): a
    path descriptor of its root."""
    fs = _syscall_fd(int(_libc.syscall(SYS_FSOPEN, fstype.encode(), FSOPEN_CLOEXEC)),
                     f"fsopen({fstype})")  # fmt: skip
    try:
        _syscall_fd(int(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0)),
                    f"fsconfig({fstype})")  # fmt: skip
        return _syscall_fd(int(_libc.syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, 0)),
                           f"fsmount({fstype})")  # fmt: skip
    finally:
        os.close(fs)


def hide_file(path: str) -> None:
    """Mount an empty root-owned file of mode 0 over ``path`` (read-only): opening it fails
    with EACCES for every uid an execution can have, whatever the mode of the file beneath."""
    mnt = new_detached_mount("tmpfs")
    try:
        os.close(os.open("hidden", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0, dir_fd=mnt))
        fd = _syscall_fd(int(_libc.syscall(SYS_OPEN_TREE, mnt, b"hidden", OPEN_TREE_CLONE)),
                         f"open_tree {path}")  # fmt: skip
    finally:
        os.close(mnt)
    try:
        ret = _libc.syscall(SYS_MOVE_MOUNT, fd, b"", -100, path.encode(), MOVE_MOUNT_F_EMPTY_PATH)
        _check(int(ret), f"move_mount {path}")
    finally:
        os.close(fd)
    _set_readonly(path, recursive=False)


def private_proc() -> None:
    """A procfs of our own on /proc that shows a process only its own uid's processes
    (``hidepid=invisible``): the service, the zygotes and other slots' executions vanish,
    with their command lines. Linux 5.8+ mounts a separate proc instance per mount."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")


PRCTL_NAMES = {
    PR_SET_PDEATHSIG: "PR_SET_PDEATHSIG",
    PR_SET_DUMPABLE: "PR_SET_DUMPABLE",
    PR_SET_CHILD_SUBREAPER: "PR_SET_CHILD_SUBREAPER",
    PR_SET_NO_NEW_PRIVS: "PR_SET_NO_NEW_PRIVS",
}


def prctl(option: int, arg: int) -> None:
    ret = _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    _check(ret, f"prctl({PRCTL_NAMES.get(option, option)})")


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    prctl(PR_SET_PDEATHSIG, sig)


class ChildFailed(Exception):
    """A throwaway child's step raised (the message is its error) or died."""


def in_throwaway_child(step: Callable[[], bytes]) -> bytes:
    """What ``step`` returns, computed in a forked child that exits after it: for what must
    not change or stay in the caller (a probe that confines itself, an import); ChildFailed
    with the step's error otherwise."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            answer = b"+" + step()
        except BaseException as exc:
            answer = b"-" + f"{type(exc).__name__}: {exc}".encode()[:500]
        os.write(w, answer)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        answer = reader.read()
    _, status = os.waitpid(pid, 0)
    if answer[:1] != b"+":
        why = answer[1:].decode(errors="replace")
        raise ChildFailed(why or f"the child died (wait status {status})")
    return answer[1:]


def set_dumpable(dumpable: bool) -> None:
    """A non-dumpable process's /proc files (environ, cmdline's neighbours, fd, mem) belong to
    root and it cannot be ptraced by its own uid: what keeps the service's environment from
    executions that run as the same user (the non-root fallback)."""
    prctl(PR_SET_DUMPABLE, int(dumpable))


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to us, so we can find and reap every one."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def set_limits(
    *,
    address_space: int,
    cpu_seconds: int,
    file_size: int,
    open_files: int,
    processes: int | None,
) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    if processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def kill_all_of_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (needs root): a helper drops to it and kills -1.

    ``kill(-1)`` walks the process list under a lock that fork needs, so a fork bomb cannot
    outrun it. The helper itself is the one process it spares.
    """
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def read_small(path: str) -> bytes:
    """The whole of a small file (of /proc) in four system calls, where ``open().read()``
    takes nine: the zygote reads three or four of them after every execution."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def my_children() -> list[int]:
    """Direct children of this (single-threaded) process."""
    pid = os.getpid()
    try:
        return [int(p) for p in read_small(f"/proc/{pid}/task/{pid}/children").split()]
    except FileNotFoundError:  # kernel without CONFIG_PROC_CHILDREN: scan /proc
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            found.append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue
        return found


def reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(deadline: float) -> bool:
    """SIGKILL every descendant; True when none is left before ``deadline``.

    As a subreaper we receive every orphan, so the topmost survivor of any subtree is always
    our direct child: kill direct children until there are none.
    """
    while True:
        reap_all()
        children = my_children()
        if not children:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def children_of_every_thread() -> list[int]:
    """Direct children of this process, whichever of its threads is their parent: an orphan
    is re-parented to any live thread of its subreaper, and each thread lists only its own."""
    found: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in read_small(f"/proc/self/task/{tid}/children").split()]
    return found


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def kill_adopted_orphans(keep: Collection[int] = (), grace_s: float = 2.0) -> int:
    """SIGKILL and reap the orphans this (subreaper) process adopted: its children in another
    session than its own, except ``keep``; how many it killed.

    Every execution leads a session of its own (``child.start``), and what it forks stays in
    that session or makes another; what the service itself starts (its zygotes) stays in the
    service's. Killing a process re-parents its own children here, so this repeats until none
    is left, or ``grace_s`` has passed. Each is reaped by its pid, never ``waitpid(-1)``, which
    would take the exit statuses asyncio waits for."""
    own = os.getsid(0)
    deadline = time.monotonic() + grace_s
    killed: set[int] = set()
    while True:
        orphans = [
            pid
            for pid in children_of_every_thread()
            if pid not in keep and _session_of(pid) not in (own, None)
        ]
        if not orphans or time.monotonic() > deadline:
            return len(killed)
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.001)


def reap_adopted_zombies() -> int:
    """Reap the zombies of other uids among this process's children; how many.

    Where no zygote may be a subreaper (gVisor allows it only pid 1) and none has a pid
    namespace, an execution's orphans are re-parented to the container's init, the service:
    killed by uid after each run, they would stay zombies there, and gVisor counts them
    against every later fork's RLIMIT_NPROC. The service's own children (its zygotes) run as
    its uid, and asyncio waits for those itself."""
    me, own_uid, reaped = str(os.getpid()), os.getuid(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = read_small(f"/proc/{entry}/stat").rsplit(b")", 1)[1].split()
            if fields[0] != b"Z" or fields[1] != me.encode():
                continue
            if os.stat(f"/proc/{entry}").st_uid == own_uid:
                continue
            if os.waitpid(int(entry), os.WNOHANG)[0]:
                reaped += 1
        except (OSError, IndexError):
            continue
    return reaped


def count_processes_of(uid: int | None) -> int:
    """Tasks (threads) of ``uid``'s processes; of every process for None."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if uid is None or os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def collapse_heap_into_huge_pages() -> int:
    """Back the anonymous heap with 2 MiB pages; returns how many MiB were collapsed.

    Forking copies one page-table entry per resident page: with numpy and sympy loaded that is
    ~12,000 entries and about half of the cost of an execution. After ``MADV_COLLAPSE`` it is a
    few dozen, and a child's first write to a shared huge page copies only 4 KiB (Linux 5.8+).
    Measured here: fork 1.3 ms -> 0.4 ms, a trivial execution 4.0 ms -> 2.1 ms.
    """
    collapsed = 0
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    for line in lines:
        parts = line.split()
        perms, path = parts[1], (parts[5] if len(parts) > 5 else "")
        if "w" not in perms or "p" not in perms or path not in ("", "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        start = (lo + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        end = hi // HUGE_PAGE * HUGE_PAGE
        if end <= start:
            continue
        _libc.madvise(start, end - start, MADV_HUGEPAGE)
        if _libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += (end - start) >> 20
    return collapsed


def memory_status() -> dict[str, int]:
    """VmSize and VmRSS of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmSize:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out
