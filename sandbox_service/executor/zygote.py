"""The zygote: preloads modules once, then forks one confined child per execution.

Run as ``python -m sandbox_service.executor.zygote CONFIG_JSON SOCKET_FD`` by a slot, one
zygote per slot, one execution at a time. Start-up: die with the parent, become a subreaper,
enter a network namespace and a read-only mount namespace of its own (when root), import the
preload list, compile the seccomp filter, freeze the heap into huge pages, then report which
isolation layers are active. Per execution the parent side (this process) owns the timer,
the output pipes, ``wait4`` and the verdict; the child confines itself and runs the code.

Namespaces are per slot, not per child: executions of a slot never overlap, and every
process of one is dead before the next starts, so a per-child namespace would add nothing but
cost (a network namespace per child: +1.4 ms on a 3 ms execution, measured here). The slot's
private /tmp (the working directory) and /dev/shm are emptied after every execution.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import math
import os
import resource
import signal
import socket
import sys
import sysconfig
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sandbox_service.executor import (
    ipc,
    judge,
    memory,
    payload,
    pidns,
    protocol,
    runner,
    seccomp_filter,
    supervise,
    wipe,
)
from sandbox_service.executor import isolation as iso
from sandbox_service.executor.memory import SlotCgroup
from sandbox_service.executor.protocol import (
    IsolationReport,
    Outcome,
    RunSpec,
    RunStatus,
    StartReport,
    ZygoteConfig,
)
from sandbox_service.executor.reset import Reset, Scratch

MIB = 1024 * 1024
SETUP_FAILED = 125
SETUP_ERROR = supervise.SETUP_ERROR
CLEANUP_GRACE_S = 2.0
SHM_MB = 64


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


# ---------------------------------------------------------------- start-up


def _try(conf: Confinement, name: str, step: Any) -> bool:
    try:
        step()
        return True
    except (OSError, ImportError, RuntimeError) as exc:
        conf.notes[name] = f"{type(exc).__name__}: {exc}"
        return False


def _probe(step: Any) -> str | None:
    """Run ``step`` in a throwaway child; None if it worked, else why not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            step()
            os._exit(0)
        except BaseException as exc:
            os.write(w, f"{type(exc).__name__}: {exc}".encode()[:500])
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else (why or f"probe exited with status {status}")


def reachable_paths(cfg: ZygoteConfig, mount: bool) -> list[str]:
    """What a slot uid must be able to read for its programs to work: the standard library
    and site-packages (a child imports what the zygote did not preload), and without the
    mount layer the work root, where its working directories are."""
    paths = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(p for p in sys.path if p.endswith("lib-dynload"))
    if not mount:
        existing = cfg.work_root
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


SCRATCH_MODE = 0o1777  # root-owned and sticky, like a host's /tmp


def scratch_dirs(cfg: ZygoteConfig) -> list[tuple[str, int]]:
    """The writable places of a slot with a mount namespace, and their sizes in MiB."""
    return [("/tmp", cfg.tmpfs_mb), ("/dev/shm", min(SHM_MB, cfg.tmpfs_mb))]


def enter_mount_namespace(cfg: ZygoteConfig, conf: Confinement) -> None:
    """A mount namespace of the zygote's own: the host read-only, /proc private, the hidden
    paths covered, a private tmpfs on each scratch directory."""
    for path, _ in scratch_dirs(cfg):  # checked before anything is made read-only
        if path in iso.kept_inside(path, interpreter_paths()):
            raise OSError(
                f"{path} itself holds the interpreter's files ({sys.prefix}, "
                f"sys.path): a private {path} would hide them; install Python elsewhere"
            )
    iso.unshare(iso.CLONE_NEWNS)
    iso.private_readonly_root()
    iso.private_proc()
    for path in cfg.hide_paths:
        iso.cover(path, interpreter_paths())
    for path, size_mb in scratch_dirs(cfg):
        kept = iso.cover(path, interpreter_paths(), size_mb=size_mb, mode=SCRATCH_MODE,
                         writable=True)  # fmt: skip
        conf.scratch_keep[path] = frozenset(os.path.relpath(k, path).split("/")[0] for k in kept)


def enter_ipc_namespace(cfg: ZygoteConfig, conf: Confinement) -> None:
    """SysV IPC and POSIX queues of the zygote's own, emptied after every execution; shared
    memory capped at the private /dev/shm's size (a new namespace's default is unlimited)."""
    conf.mq_fd = ipc.enter_namespace(shm_mb=min(SHM_MB, cfg.tmpfs_mb))


def enter_memory_cgroup(cfg: ZygoteConfig, conf: Confinement) -> None:
    """A memory cgroup of the zygote's own, so that a limit holds per execution tree."""
    if os.geteuid() != 0:
        raise PermissionError("not running as root: the limit is per process (RLIMIT_AS)")
    conf.cgroup = memory.SlotCgroup(memory.cgroup_name(cfg.slot, cfg.uid))


def enter_pid_namespace(cfg: ZygoteConfig, sock: socket.socket) -> str | None:
    """Go on as pid 1 of a pid namespace of the zygote's own (``executor.pidns``); None if
    done or not asked for, else why not."""
    if "pid" not in cfg.layers:
        return None
    if os.geteuid() != 0:
        return "not running as root: pids of the host's processes answer probes"
    try:
        pidns.enter(sock.fileno())
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def confine_zygote(cfg: ZygoteConfig) -> Confinement:
    """Enter this zygote's own namespaces and find out which layers children can apply."""
    conf = Confinement()
    root = os.geteuid() == 0
    wanted = set(cfg.layers)
    if "net" in wanted:
        conf.net = _try(conf, "net", lambda: iso.unshare(iso.CLONE_NEWNET))
    if "memory" in wanted:  # before the mount layer makes /sys read-only
        conf.memory = _try(conf, "memory", lambda: enter_memory_cgroup(cfg, conf))
    if "ipc" in wanted:
        conf.ipc = _try(conf, "ipc", lambda: enter_ipc_namespace(cfg, conf))
    if "mount" in wanted:
        conf.mount = _try(conf, "mount", lambda: enter_mount_namespace(cfg, conf))
    if conf.ipc and conf.mount:
        _try(conf, "ipc_dev_mqueue", ipc.cover_dev_mqueue)
    if "uid" in wanted:
        if not root or cfg.uid is None:
            conf.notes["uid"] = "not running as root: code runs as the service's own user"
        else:
            iso.kill_all_of_uid(cfg.uid)  # leftovers of a zygote that died before us
            uid, gid = cfg.uid, cfg.gid if cfg.gid is not None else cfg.uid
            needed = reachable_paths(cfg, conf.mount)
            why = _probe(lambda: _uid_probe(uid, gid, needed))
            conf.uid = why is None
            if why:
                conf.notes["uid"] = why
    if "seccomp" in wanted:

        def load_filter() -> None:
            program = seccomp_filter.Program(seccomp_filter.build_bpf())
            why = _probe(lambda: _seccomp_probe(program))
            if why:
                raise RuntimeError(why)
            conf.filter = program

        conf.seccomp = _try(conf, "seccomp", load_filter)
    return conf


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


# ---------------------------------------------------------------- one execution


def _write_files(files: dict[str, str]) -> None:
    for path, data in files.items():
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


def cpu_limit_s(timeout_s: float) -> int:
    """RLIMIT_CPU of each process of an execution: a backstop past the wall-clock limit."""
    return math.ceil(timeout_s) + 1


def _tree_cpu_s() -> float:
    """CPU seconds of every child this process has reaped so far (kernel accounting)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _decode_request(
    spec: RunSpec[memoryview], buffer: payload.Payload
) -> tuple[str, dict[str, str]]:
    """The code and files of ``spec``, decoded in the child's own memory; then the child's copy
    of the zygote's buffer is zeroed, so that nothing forked off user code finds the request
    there (a driver's spec travels on stdin: ``driver.py``)."""
    code = bytes(spec.code).decode("utf-8", "surrogatepass")
    files = spec.files
    if isinstance(files, memoryview):
        files = protocol.decode_payload("files", bytes(files))
    buffer.wipe()
    return code, files or {}


def child(spec: RunSpec[memoryview], cfg: ZygoteConfig, conf: Confinement,
          pipes: supervise.Pipes, workdir: str, zygote_pid: int,
          buffer: payload.Payload) -> None:  # fmt: skip
    """Confine this freshly forked process (descriptors already in place) and run the program;
    never returns."""
    code, files = _decode_request(spec, buffer)
    uid = cfg.uid if conf.uid and cfg.uid is not None else os.getuid()
    gid = (cfg.gid if cfg.gid is not None else uid) if conf.uid else os.getgid()
    iso.set_limits(
        address_space=conf.base_address_space + spec.memory_mb * MIB,
        cpu_seconds=cpu_limit_s(spec.timeout_s),
        file_size=cfg.max_file_mb * MIB,
        open_files=cfg.max_open_files,
        processes=cfg.max_processes if conf.uid else conf.shared_process_limit,
    )
    if conf.cgroup is not None:
        memory.make_killable()
    if conf.uid:
        iso.drop_to(uid, gid)
    iso.die_with_parent()  # after the uid change, which clears it
    iso.set_dumpable(True)  # its own /proc/self as any process has (the zygote's is hidden)
    if os.getppid() != zygote_pid:
        os._exit(SETUP_FAILED)
    os.chdir(workdir)
    _write_files(files)
    if conf.filter is not None:
        iso.no_new_privs()
        conf.filter.load()
    runner.main(code, spec.mode.value, workdir)


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


def slot_dir(cfg: ZygoteConfig) -> str:
    """This slot's directory under work_root when there is no private /tmp. Several services
    may share a host and a work_root: named by the slot's uid (no two live services share
    one) or, without one, by the service's pid."""
    name = f"slot-{cfg.uid}" if cfg.uid is not None else f"slot-{os.getppid()}-{cfg.slot}"
    return os.path.join(cfg.work_root, name)


class Zygote:
    def __init__(self, cfg: ZygoteConfig, conf: Confinement, base_rss: int = 0,
                 buffer: payload.Payload | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.conf = conf
        self.payload = buffer or payload.Payload(self.result_room)
        self.base_rss = base_rss  # what a child's resident memory starts from
        self.pid = os.getpid()
        # In a pid namespace every zygote is pid 1: a random tag names its run directories.
        self.run_tag = os.urandom(4).hex() if pidns.inside() else str(self.pid)
        self.runs = 0
        self.dirty = False
        self.reset = Reset(
            scratch=[Scratch(path, conf.scratch_keep.get(path, frozenset()), SCRATCH_MODE)
                     for path, _ in scratch_dirs(cfg)] if conf.mount else [],
            ipc=conf.ipc,
            mq_fd=conf.mq_fd,
        )  # fmt: skip
        self.unclean: str | None = None  # why the last reset failed: the zygote is recycled

    @property
    def result_room(self) -> int:
        """What a result needs of the payload buffer: both output streams, one byte over."""
        return 2 * (self.cfg.max_output_bytes + 1)

    def receive(self, sock: socket.socket) -> dict[str, Any] | None:
        """The next request, its payload in the buffer; a larger buffer is a larger address
        space in every child, which the limit then leaves out as it does the interpreter."""
        size = self.payload.size
        message = payload.receive(sock, self.payload, self.result_room)
        self.conf.base_address_space += self.payload.size - size
        return message

    def _workdir(self) -> str:
        if self.conf.mount:
            return "/tmp"
        # The zygote's pid in the name: what a predecessor could not remove never collides.
        name = f"run-{self.run_tag}-{self.runs}"
        path = os.path.join(slot_dir(self.cfg), name)
        os.makedirs(path, mode=0o700)
        if self.conf.uid and self.cfg.uid is not None:
            os.chown(path, self.cfg.uid, self.cfg.gid if self.cfg.gid is not None else self.cfg.uid)
        return path

    def _reset_workdir(self, workdir: str) -> None:
        """Leave nothing of this execution for the next one; a slot that cannot is recycled."""
        run_dir = () if self.conf.mount else (Scratch(workdir, remove=True),)
        why = self.reset.run(run_dir)
        if why is not None:
            self.unclean = why
            self.dirty = True

    def _fork(self, spec: RunSpec[memoryview], pipes: supervise.Pipes, workdir: str) -> int:
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.dup2(pipes.stdin, 0)
            os.dup2(pipes.out_w, 1)
            os.dup2(pipes.err_w, 2)
            os.dup2(pipes.st_w, runner.STATUS_FD)
            os.closerange(runner.STATUS_FD + 1, 1 << 16)
            try:
                child(spec, self.cfg, self.conf, pipes, workdir, self.pid, self.payload)
            except BaseException as exc:
                try:
                    msg = f"{SETUP_ERROR.decode()} {type(exc).__name__}: {exc}"
                    os.write(runner.STATUS_FD, msg.encode())
                finally:
                    os._exit(SETUP_FAILED)
        return pid

    def _clean_up(self, pid: int) -> tuple[int, Any]:
        """Kill whatever is left of the execution, reap it all; (wait status, rusage)."""
        try:
            os.killpg(pid, signal.SIGKILL)  # the child is at worst a zombie: its pgid is ours
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(pid, 0)
        if iso.my_children():  # escaped the group (setsid, double fork)
            if self.conf.uid and self.cfg.uid is not None:
                iso.kill_all_of_uid(self.cfg.uid)
            if not iso.kill_descendants(time.monotonic() + CLEANUP_GRACE_S):
                self.dirty = True
        return status, usage

    def execute(self, spec: RunSpec[memoryview]) -> Outcome[memoryview]:
        self.runs += 1
        timeout_s = spec.timeout_s
        workdir = self._workdir()
        stdin = spec.stdin if isinstance(spec.stdin, memoryview) else b""  # "": none sent
        pipes = supervise.Pipes.open(stdin)
        if self.conf.cgroup is not None:
            self.conf.cgroup.begin(spec.memory_mb)
        cpu_before = _tree_cpu_s()
        start = time.monotonic()
        pid = self._fork(spec, pipes, workdir)
        pipes.close_child_ends()
        pidfd = os.pidfd_open(pid)
        cap = self.cfg.max_output_bytes
        streams = {
            pipes.out_r: supervise.Capture(cap, self.payload.take(cap + 1)),
            pipes.err_r: supervise.Capture(cap, self.payload.take(cap + 1)),
        }
        try:
            cgroup = self.conf.cgroup
            sampler = memory.TreeSampler(spec.memory_mb) if cgroup is None else None
            alarm = cgroup.oom_alarm if cgroup is not None else None
            over = sampler.over if sampler is not None else None
            seen = supervise.watch(pidfd, streams, timeout_s, start, alarm, over)
            status, usage = self._clean_up(pid)
            tree = cgroup.end() if cgroup is not None else sampler.outcome() if sampler else None
            supervise.drain(streams)
            os.set_blocking(pipes.st_r, False)
            try:
                note = os.read(pipes.st_r, 4096)
            except BlockingIOError:
                note = b""
        finally:
            os.close(pidfd)
            pipes.close_parent_ends()
            self._reset_workdir(workdir)
        out, err = streams[pipes.out_r], streams[pipes.err_r]
        tree_cpu = _tree_cpu_s() - cpu_before
        observed = judge.Observed(
            wait_status=status,
            watch=seen,
            setup_note=note,
            tree_cpu_s=tree_cpu,
            cpu_limit_s=cpu_limit_s(timeout_s),
            peak_rss_bytes=usage.ru_maxrss * 1024,
            base_rss_bytes=self.base_rss,
            memory_mb=spec.memory_mb,
            timeout_s=timeout_s,
            tree=tree,
        )
        verdict_, code, sig, message = judge.verdict(observed, [out, err])
        return Outcome(
            status=RunStatus(verdict_),
            exit_code=code,
            signal=sig,
            stdout=out.data(),  # sent from the payload buffer, never copied into the heap
            stderr=err.data(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_time_s=round(seen.end - start, 6),
            cpu_time_s=round(tree_cpu, 6),
            peak_memory_mb=memory.peak_mb(tree, round(usage.ru_maxrss / 1024, 3)),
            message=message,
        )


def serve(sock: socket.socket, zygote: Zygote) -> None:
    while True:
        msg = zygote.receive(sock)
        if msg is None or msg.get("op") == "exit":
            return
        result: Outcome[memoryview]
        try:
            result = zygote.execute(RunSpec.from_frame(msg))
        except Exception as exc:  # a fault of ours, never the program's
            why = f"zygote: {type(exc).__name__}: {exc}"
            result = Outcome(status=RunStatus.internal_error, message=why)
            zygote.dirty = True  # whatever broke may break the next run too: start afresh
        if zygote.dirty:
            result = replace(result, recycle=True)
            why = zygote.unclean or result.message or "could not clean up"
            print(f"zygote of slot {zygote.cfg.slot}: recycled: {why}", file=sys.stderr)
        protocol.send(sock, result.frame())
        del msg, result  # their views into the payload buffer
        zygote.payload.wipe()
        if zygote.dirty:
            return  # go-judge's rule: never reuse an environment that failed to reset


def main(argv: list[str]) -> None:
    if sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]  # Python 3.10 (no -P): the directory we were started in is not ours
    cfg = ZygoteConfig(**json.loads(argv[0]))
    sock = socket.socket(fileno=int(argv[1]))
    iso.die_with_parent()
    iso.become_subreaper()
    iso.set_dumpable(False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the service, which stops us
    pid_note = enter_pid_namespace(cfg, sock)
    conf = confine_zygote(cfg)
    conf.pid = pidns.inside()
    if conf.pid and not conf.mount:
        pidns.own_proc()  # never the host's /proc seen from the zygote's namespace
    if pid_note:
        conf.notes["pid"] = pid_note
    failed = preload(cfg.preload, cfg.warmup)
    if not conf.mount:
        # A predecessor killed mid-run (SIGKILL, OOM) left its run directory behind, and ours
        # start from run-0 again: the slot's directory is ours alone, so empty it first.
        own = slot_dir(cfg)
        with contextlib.suppress(OSError, wipe.WipeIncomplete):  # what stays is not reused
            wipe.remove_tree(own)
        make_work_root(cfg.work_root)
        os.makedirs(own, mode=0o711, exist_ok=True)
    os.environ.clear()
    os.environ.update(runner.environment("/tmp" if conf.mount else cfg.work_root))
    gc.collect()
    gc.freeze()  # children's collections then leave the preloaded objects (and their pages) alone
    huge_mb = iso.collapse_heap_into_huge_pages()
    buffer = payload.Payload(2 * (cfg.max_output_bytes + 1))  # before the address space is read
    mem = iso.memory_status()
    conf.base_address_space = mem.get("VmSize", 0)
    if not conf.uid:
        conf.shared_process_limit = iso.count_processes_of(os.getuid()) + 4 * cfg.max_processes
    report = StartReport(
        pid=os.getpid(),
        isolation=conf.report(),
        preload_failed=failed,
        rss_mb=round(mem.get("VmRSS", 0) / MIB, 1),
        address_space_mb=round(conf.base_address_space / MIB, 1),
        huge_pages_mb=huge_mb,
        cgroup=conf.cgroup.path if conf.cgroup is not None else None,
    )
    protocol.send(sock, report.frame())
    serve(sock, Zygote(cfg, conf, base_rss=mem.get("VmRSS", 0), buffer=buffer))


if __name__ == "__main__":
    main(sys.argv[1:])
