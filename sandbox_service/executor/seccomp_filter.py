"""The seccomp filter every child loads: no new inet sockets, no kernel-administration syscalls.

The zygote compiles the filter once with libseccomp (``pyseccomp``) and keeps the raw BPF; a
child loads those bytes with one ``prctl``, so libseccomp never runs per execution.

Denied with EPERM: ``socket()`` of every family, unix included (a unix socket on the host's
filesystem, a database's say, is reachable from any network namespace; ``socketpair`` still
works for local plumbing such as asyncio's), ``kill(-1)`` (in the non-root fallback every
process shares the service's uid), ptrace and cross-process memory access, (u)mount and the
new mount API, namespaces (unshare, setns, clone with namespace flags), bpf, perf_event_open,
kernel modules, kexec, keyrings, reboot, swap, clocks, io_uring and userfaultfd (both have
bypassed filters before).
``clone3`` answers ENOSYS rather than EPERM so that glibc falls back to ``clone``, whose flags
the filter can inspect; EPERM there would break every new thread.
"""

from __future__ import annotations

import ctypes
import errno
import os

from sandbox_service.executor import isolation as iso

AF_UNIX = 1
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "keyctl", "add_key", "request_key", "reboot", "swapon", "swapoff",
    "acct", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "iopl", "ioperm", "open_by_handle_at",
    "name_to_handle_at", "quotactl", "lookup_dcookie", "fanotify_init", "vhangup", "uselib",
    "nfsservctl",
)  # fmt: skip


def build_bpf() -> bytes:
    """Compile the filter for this machine's architecture. Raises ImportError/OSError when
    libseccomp is missing, which the zygote reports as the seccomp layer being unavailable."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            flt.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture
    flt.add_rule(deny, "socket")
    flt.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    flt.add_rule(deny, "kill", sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, 0xFFFFFFFF))  # pid -1
    for flag in NAMESPACE_FLAGS:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("seccomp-bpf")
    try:
        with os.fdopen(os.dup(fd), "rb") as reader:
            flt.export_bpf(reader)
            os.lseek(fd, 0, os.SEEK_SET)
            return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def build_bpf_apart() -> bytes:
    """``build_bpf`` in a throwaway child, so that the caller never imports libseccomp's
    bindings: they bring threading and subprocess, whose after-fork work every child of a
    zygote would repeat (+0.3 to 0.5 ms of CPU per fork here; docs/benchmarks.md)."""
    try:
        return iso.in_throwaway_child(build_bpf)
    except iso.ChildFailed as exc:
        raise OSError(str(exc)) from None


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Program:
    """A compiled filter, laid out in memory once (in the zygote) so a child only calls prctl."""

    def __init__(self, bpf: bytes) -> None:
        self.bpf = bpf
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self._buf))
        self._libc = ctypes.CDLL(None, use_errno=True)

    def load(self) -> None:
        """Install on the calling thread and its future children (irreversible); the caller
        must have set no_new_privs first."""
        ret = self._libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._prog), 0, 0)
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: {os.strerror(err)}")
