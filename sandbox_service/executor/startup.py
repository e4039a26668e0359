"""A zygote's start-up: enter the namespaces of its own, find out which isolation layers work,
preload.

Each layer is tried and probed (in a throwaway child where trying would change the zygote), and
what does not work is reported with why, never assumed (``Confinement.report``). Namespaces are
per zygote, not per child: executions of a slot never overlap, and every process of one is
dead before the next starts, so a per-child namespace would add nothing but cost (a network
namespace per child: +1.4 ms on a 3 ms execution, measured here).

The pid namespace. ``/proc`` already hides other processes (``hidepid``), but a pid can be
probed without it: ``getpgid``, ``kill(pid, 0)`` and ``pidfd_open`` answer for any process of
the host. In a pid namespace of its own the zygote is pid 1 and an execution's processes are
the only others, so probing finds nothing else; and when the zygote dies, the kernel kills
whatever is left in it.

A process cannot move itself into a new pid namespace, only its children are born in one, so
the zygote's process forks once at start: the child, pid 1 of the new namespace, becomes the
zygote; the parent stays as its *keeper*, which the service sees as the zygote (its pid, its
exit status, SIGKILL to it kills the zygote through ``PR_SET_PDEATHSIG``) and which holds
nothing but a bare interpreter. The namespace needs a ``/proc`` of its own (the zygote reads
its children there): it comes with the mount layer, or the zygote mounts one alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sandbox_service.executor import ipc, memory, monitor, seccomp_filter
from sandbox_service.executor import isolation as iso
from sandbox_service.executor.memory import SlotCgroup
from sandbox_service.executor.protocol import IsolationReport, ZygoteConfig
from sandbox_service.executor.workdir import SCRATCH_MODE, SHM_MB, scratch_dirs


@dataclass
class Confinement:
    """The layers that turned out to be available, and what a child needs to apply them."""

    net: bool = False
    ipc: bool = False
    pid: bool = False
    mount: bool = False
    uid: bool = False
    seccomp: bool = False
    memory: bool = False
    notes: dict[str, str] = field(default_factory=dict)
    filter: seccomp_filter.Program | None = None
    scratch_keep: dict[str, frozenset[str]] = field(default_factory=dict)
    mq_fd: int | None = None  # the IPC namespace's POSIX queues, to remove them after each run
    cgroup: SlotCgroup | None = None  # the zygote's own, holding every execution's tree
    base_address_space: int = 0
    # Without a uid of its own, RLIMIT_NPROC counts every process of the service's user: the
    # limit is what that user had at start plus headroom, enough to stop a fork bomb from
    # exhausting the host's pids, not to give each execution its own budget.
    shared_process_limit: int | None = None
    # gVisor counts every task of the sandbox against RLIMIT_NPROC, whatever its uid.
    nproc_counts_all: bool = False
    # Orphans come back to the zygote (pid 1 of its namespace, or a subreaper); where neither
    # holds (gVisor allows no subreaper but pid 1), every run ends with a kill by uid.
    adopts_orphans: bool = True
    exit_watch: type[monitor.ChildExit] = monitor.ChildExit  # a pidfd, or SIGCHLD (gVisor)

    def process_limit(self, per_uid: int) -> int | None:
        """A child's RLIMIT_NPROC: its own uid's budget, or the shared one."""
        if self.uid and not self.nproc_counts_all:
            return per_uid
        return self.shared_process_limit

    def report(self) -> IsolationReport:
        layers = {
            "net": self.net,
            "ipc": self.ipc,
            "pid": self.pid,
            "mount": self.mount,
            "uid": self.uid,
            "seccomp": self.seccomp,
            "memory": self.memory,
            "rlimits": True,
        }
        return IsolationReport(layers, dict(self.notes))


class StartFailed(Exception):
    """A start-up step failed: its name, then the call and its errno."""


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Name the start-up step whose failure stops the zygote: "orphans: prctl(...): EINVAL"."""
    try:
        yield
    except StartFailed:
        raise
    except OSError as exc:  # Python's own calls name the path, not the errno: add it
        code = errno.errorcode.get(exc.errno or 0)
        said = str(exc) if code is None or code in str(exc) else described(exc, code)
        raise StartFailed(f"{name}: {said}") from exc
    except Exception as exc:
        raise StartFailed(f"{name}: {type(exc).__name__}: {exc}") from exc


def described(exc: OSError, code: str) -> str:
    """ "EACCES (Permission denied): /path" for an OSError of Python's own calls."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{type(exc).__name__}: {code} ({exc.strerror}){where}"


def _try(confinement: Confinement, name: str, step: Any) -> bool:
    try:
        step()
        return True
    except (OSError, ImportError, RuntimeError) as exc:
        confinement.notes[name] = f"{type(exc).__name__}: {exc}"
        return False


def _probe(step: Callable[[], None]) -> str | None:
    """Run ``step`` in a throwaway child; None if it worked, else why not."""

    def run() -> bytes:
        step()
        return b""

    try:
        iso.in_throwaway_child(run)
    except iso.ChildFailed as exc:
        return str(exc)
    return None


def reachable_paths(config: ZygoteConfig, mount: bool) -> list[str]:
    """What a slot uid must be able to read for its programs to work: the standard library
    and site-packages (a child imports what the zygote did not preload), and without the
    mount layer the work root, where its working directories are."""
    paths = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(p for p in sys.path if p.endswith("lib-dynload"))
    if not mount:
        existing = config.work_root
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        paths.add(existing)
    return sorted(p for p in paths if p and os.path.isdir(p))


def _uid_probe(uid: int, gid: int, paths: list[str]) -> None:
    iso.drop_to(uid, gid)
    for path in paths:
        if not os.access(path, os.R_OK | os.X_OK):
            raise PermissionError(
                f"slot uid {uid} cannot read {path} (a directory on its way is closed to "
                "other users): install Python where every user can read it, use a work_root "
                "every user can reach, or enable the mount layer"
            )


def _seccomp_probe(program: seccomp_filter.Program) -> None:
    iso.no_new_privs()
    program.load()
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except PermissionError:
        return
    raise RuntimeError("filter loaded but an inet socket was still allowed")


def interpreter_paths() -> list[str]:
    """What a child needs to keep seeing to import modules: prefixes and sys.path."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted({os.path.realpath(p) for p in paths} | {os.path.abspath(p) for p in paths})


def enter_mount_namespace(config: ZygoteConfig, confinement: Confinement) -> None:
    """A mount namespace of the zygote's own: the host read-only, /proc private, the hidden
    paths covered, a private tmpfs on each scratch directory."""
    for path, _ in scratch_dirs(config):  # checked before anything is made read-only
        if path in iso.kept_inside(path, interpreter_paths()):
            raise OSError(
                f"{path} itself holds the interpreter's files ({sys.prefix}, "
                f"sys.path): a private {path} would hide them; install Python elsewhere"
            )
    iso.unshare(iso.CLONE_NEWNS)
    iso.private_readonly_root()
    iso.private_proc()
    for path in config.hide_paths:
        iso.cover(path, interpreter_paths())
    for path in secret_paths(config):
        iso.hide_file(path)
    for path, size_mb in scratch_dirs(config):
        kept = iso.cover(path, interpreter_paths(), size_mb=size_mb, mode=SCRATCH_MODE,
                         writable=True)  # fmt: skip
        tops = frozenset(os.path.relpath(k, path).split("/")[0] for k in kept)
        confinement.scratch_keep[path] = tops


def enter_ipc_namespace(config: ZygoteConfig, confinement: Confinement) -> None:
    """SysV IPC and POSIX queues of the zygote's own, emptied after every execution; shared
    memory capped at the private /dev/shm's size (a new namespace's default is unlimited)."""
    confinement.mq_fd, uncapped = ipc.enter_namespace(shm_mb=min(SHM_MB, config.tmpfs_mb))
    if uncapped:
        confinement.notes["ipc"] = uncapped


def enter_memory_cgroup(config: ZygoteConfig, confinement: Confinement) -> None:
    """A memory cgroup of the zygote's own, so that a limit holds per execution tree."""
    if os.geteuid() != 0:
        raise PermissionError("not running as root: the limit is per process (RLIMIT_AS)")
    name = memory.cgroup_name(config.slot, config.uid)
    try:
        confinement.cgroup = memory.SlotCgroup(name)
    except OSError as exc:
        if exc.errno != errno.EROFS or not exc.filename:
            raise
        writable_cgroup_mount(str(exc.filename))
        confinement.cgroup = memory.SlotCgroup(name)
        confinement.notes["memory"] = (
            "the container's cgroup mount is read-only: made writable in the zygote's own "
            "mount namespace (the slot's cgroup stays for its next zygote)"
        )


def writable_cgroup_mount(path: str) -> None:
    """In a mount namespace of the zygote's own, the read-only mount holding ``path`` (an
    engine mounts the container's own cgroup read-only) remounted writable: the cgroup is
    the container's, which its root may already change; executions, never root, cannot
    write its root-owned files, and the mount layer makes it read-only again for them."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    target = max((p for p in points if iso.within(path, p)), key=len)
    iso.unshare(iso.CLONE_NEWNS)
    iso.mount("none", "/", None, iso.MS_REC | iso.MS_PRIVATE, None)
    flags = iso.MS_REMOUNT | iso.MS_BIND | iso.MS_NOSUID | iso.MS_NODEV | iso.MS_NOEXEC
    iso.mount("none", target, None, flags, None)


def enter_pid_namespace(config: ZygoteConfig, sock: socket.socket) -> str | None:
    """Go on as pid 1 of a pid namespace of the zygote's own (``enter_pid_namespace_as_init``);
    None if done or not asked for, else why not."""
    if "pid" not in config.layers:
        return None
    if os.geteuid() != 0:
        return "not running as root: pids of the host's processes answer probes"
    shared = shared_procfs()
    if shared:
        return shared
    try:
        enter_pid_namespace_as_init(sock.fileno())
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# What holds where no memory cgroup does (monitor.watch's sampler, memory.TreeSampler).
SAMPLER_STANDS_IN = (
    "; the memory sampler stands in: the tree's resident memory every "
    f"{monitor.SAMPLE_S * 1000:.0f} ms, and RLIMIT_AS per process"
)


def memory_layer(config: ZygoteConfig, found: Confinement) -> bool:
    """The memory cgroup if it can be had, else a note of why and what stands in."""
    if _try(found, "memory", lambda: enter_memory_cgroup(config, found)):
        return True
    found.notes["memory"] += SAMPLER_STANDS_IN
    return False


def confine_zygote(config: ZygoteConfig) -> Confinement:
    """Enter this zygote's own namespaces and find out which layers children can apply."""
    found = Confinement()
    root = os.geteuid() == 0
    wanted = set(config.layers)
    if "net" in wanted:
        found.net = _try(found, "net", lambda: iso.unshare(iso.CLONE_NEWNET))
    if "memory" in wanted:  # before the mount layer makes /sys read-only
        found.memory = memory_layer(config, found)
    if "ipc" in wanted:
        found.ipc = _try(found, "ipc", lambda: enter_ipc_namespace(config, found))
    if "mount" in wanted:
        found.mount = _try(found, "mount", lambda: enter_mount_namespace(config, found))
    if found.ipc and found.mount:
        _try(found, "ipc_dev_mqueue", ipc.cover_dev_mqueue)
    if "uid" in wanted:
        if not root or config.uid is None:
            found.notes["uid"] = "not running as root: code runs as the service's own user"
        else:
            iso.kill_all_of_uid(config.uid)  # leftovers of a zygote that died before us
            uid, gid = config.uid, config.gid if config.gid is not None else config.uid
            needed = reachable_paths(config, found.mount)
            why = _probe(lambda: _uid_probe(uid, gid, needed))
            found.uid = why is None
            if why:
                found.notes["uid"] = why
    if "seccomp" in wanted:

        def load_filter() -> None:
            program = seccomp_filter.Program(seccomp_filter.build_bpf_apart())
            why = _probe(lambda: _seccomp_probe(program))
            if why:
                raise RuntimeError(why)
            found.filter = program

        found.seccomp = _try(found, "seccomp", load_filter)
    return found


def preload(modules: list[str], warmup: str) -> list[str]:
    """Import the preload list (and run the warm-up); return what failed, with why."""
    # Thread pools started by BLAS would not survive fork; one thread each is what children get.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    failed = []
    for name in modules:
        try:
            __import__(name)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    if "numpy" in sys.modules:
        # numpy 2 imports numpy.random lazily; children reseed it, which must not import it.
        __import__("numpy.random")
    if warmup:
        try:
            exec(compile(warmup, "<warmup>", "exec"), {"__name__": "__warmup__"})
        except Exception as exc:
            failed.append(f"<warmup>: {type(exc).__name__}: {exc}")
    return failed


# ---------------------------------------------------------------- the pid namespace


CLONE_NEWPID = 0x20000000


def enter_pid_namespace_as_init(sock_fd: int) -> None:
    """Fork into a new pid namespace; returns in the child (pid 1 there), which goes on as
    the zygote. This process waits for it and exits as it did; OSError (in this process, no
    fork made) when the kernel refuses the namespace."""
    iso.unshare(CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        iso.die_with_parent()  # the keeper's death (SIGKILL from the slot) is the zygote's
        return
    os.close(sock_fd)  # the zygote's alone: its end of file must be the slot's news of its exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def shared_procfs() -> str | None:
    """Why a pid namespace's own /proc cannot be had here, if so. gVisor's procfs (release
    20221219, seen here) is one instance for every mount: a zygote mounting its own made the
    other zygotes' /proc show its namespace (their /proc/self vanished), so in gVisor none
    does, and without a /proc of its own a zygote must stay in the container's namespace."""
    if in_gvisor():
        return (
            "gVisor: its procfs shows every mount one pid namespace, so a zygote's own /proc "
            "would show another zygote's; the container's pid namespace is shared"
        )
    return None


def in_gvisor() -> bool:
    return os.path.exists("/proc/sentry-meminfo")  # gVisor's Sentry; no Linux has it


def gvisor_quirks(confinement: Confinement, max_processes: int) -> None:
    """What gVisor (20221219) does otherwise than Linux, made up for and reported.

    Its /proc shows a non-dumpable process's command line and environment to other uids:
    without a pid namespace, an execution would read the service's (/proc/1/environ, with
    whatever secret its environment holds). A mount namespace of the zygote's own covers
    the service's /proc entry with an empty tmpfs of mode 0 (no mount leaves gVisor's
    sandbox). And RLIMIT_NPROC counts every task of the sandbox, not the uid's: the limit is
    what runs at start plus four executions' worth, as without a uid of its own."""
    if not in_gvisor():
        return
    confinement.nproc_counts_all = True
    confinement.notes["rlimits"] = (
        "gVisor counts every task of the sandbox in RLIMIT_NPROC: the limit is those at "
        f"start + 4 x max_processes ({max_processes})"
    )
    if confinement.pid or confinement.mount:
        return
    service = os.getppid()
    try:
        iso.unshare(iso.CLONE_NEWNS)
        flags = iso.MS_NOSUID | iso.MS_NODEV | iso.MS_NOEXEC
        iso.mount("tmpfs", f"/proc/{service}", "tmpfs", flags, "size=4k,mode=0")
        confinement.notes["proc"] = f"/proc/{service} (the service) covered: gVisor shows environ"
    except OSError as exc:
        confinement.notes["proc"] = f"/proc/{service} (the service) visible to executions: {exc}"


def in_own_pid_namespace() -> bool:
    """Whether this process is the init of a pid namespace (the zygote after ``enter``)."""
    return os.getpid() == 1


def adopt_orphans(confinement: Confinement) -> None:
    """Make every orphan of an execution the zygote's child, to find and kill it: pid 1 of a
    namespace is adopted by the kernel; else become a subreaper, which gVisor allows only
    pid 1 (EINVAL): then the clean-up after each run kills by uid (or only the group)."""
    if confinement.pid:
        return
    try:
        iso.become_subreaper()
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        confinement.adopts_orphans = False
        by = "the slot uid's every process" if confinement.uid else "its process group only"
        confinement.notes["subreaper"] = f"{exc}: after each run, kills {by}"


def mount_own_proc(confinement: Confinement) -> None:
    """A /proc showing this namespace, for a zygote without the mount layer. Where the kernel
    will not change ``/``'s propagation (gVisor: EINVAL; its mounts never reach the host's),
    the new /proc is mounted without; where it has no ``hidepid``, without that."""
    iso.unshare(iso.CLONE_NEWNS)
    try:
        iso.mount("none", "/", None, iso.MS_REC | iso.MS_PRIVATE, None)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        confinement.notes["proc"] = f"{exc}: /proc mounted with the propagation as it was"
    try:
        iso.private_proc()
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        iso.mount("proc", "/proc", "proc", iso.MS_NOSUID | iso.MS_NODEV | iso.MS_NOEXEC, None)
        note = f"{exc}: /proc without hidepid (it shows this namespace's processes only)"
        confinement.notes["proc"] = "; ".join(filter(None, [confinement.notes.get("proc"), note]))


# ---------------------------------------------------------------- the service's credentials


def secret_paths(config: ZygoteConfig) -> list[str]:
    """Every path under which a credential file of the service is reached: as named, and
    where its links lead (a Kubernetes Secret's file is a link into a dated directory)."""
    paths = set()
    for name in config.secret_files:
        for path in (os.path.abspath(name), os.path.realpath(name)):
            if os.path.isfile(path):
                paths.add(path)
    return sorted(paths)


def _readable(paths: list[str]) -> list[str]:
    found = []
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            continue
        found.append(f"{path} (mode {stat.S_IMODE(os.stat(path).st_mode):04o})")
    return found


def check_secrets_hidden(config: ZygoteConfig, confinement: Confinement) -> None:
    """Refuse to start while an execution could open a credential file of the service: the
    mount layer covers each (``hide_file``); without it, only a file the slot uid cannot read
    passes (root's, mode 0400 or 0600)."""
    paths = secret_paths(config)
    if not paths:
        return
    uid = config.uid if confinement.uid and config.uid is not None else None
    gid = config.gid if config.gid is not None else uid

    def probe() -> bytes:
        if uid is not None and gid is not None:
            iso.drop_to(uid, gid)
        return "\n".join(_readable(paths)).encode()

    open_to_them = [p for p in iso.in_throwaway_child(probe).decode().split("\n") if p]
    if open_to_them:
        who = f"slot uid {uid}" if uid is not None else f"uid {os.getuid()} (no slot uid here)"
        mount = confinement.notes.get("mount", "the mount layer is off")
        raise PermissionError(
            f"{who} can read the service's credentials {', '.join(open_to_them)}, and nothing "
            f"hides them ({mount}): make each root's only (mode 0400; a Secret's defaultMode) "
            "and run as root with the uid layer, or enable the mount layer"
        )
