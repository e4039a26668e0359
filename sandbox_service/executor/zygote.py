"""The zygote: preloads modules once, then forks one confined child per execution.

Run as ``python -m sandbox_service.executor.zygote CONFIG_JSON SOCKET_FD`` by a slot, one
zygote per slot, one execution at a time. Start-up (``startup``): die with the parent, enter
namespaces of its own (when root), adopt orphans (pid 1 of its pid namespace, else a
subreaper), import the preload list, compile the seccomp filter; then freeze the heap into
huge pages and report which isolation layers are active, or the step that failed (the call
and its errno) in a ``StartFailure`` frame. Per execution this process, the parent, owns the
timer, the output pipes (``monitor``), ``wait4``, the working directory's reset (``workdir``)
and the verdict (``judge``); the child confines itself and runs the code (``child``).
"""

from __future__ import annotations

import fnmatch
import functools
import gc
import json
import os
import resource
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sandbox_service.executor import child, judge, memory, monitor, payload, protocol, startup
from sandbox_service.executor import isolation as iso
from sandbox_service.executor.protocol import (
    Outcome,
    RunSpec,
    RunStatus,
    StartFailure,
    StartReport,
    ZygoteConfig,
)
from sandbox_service.executor.startup import Confinement
from sandbox_service.executor.workdir import WorkDirs, prepare_slot_dir

MIB = 1024 * 1024
CLEANUP_GRACE_S = 2.0


def result_room(config: ZygoteConfig) -> int:
    return 2 * (config.max_output_bytes + 1) + protocol.MAX_ARTIFACTS_BYTES


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _tree_cpu_s() -> float:
    """CPU seconds of every child this process has reaped so far (kernel accounting)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _runqueue_wait_s(pid: int) -> float:
    """Seconds process ``pid`` has spent runnable but waiting for a CPU (its schedstat's
    run_delay: zeroed at fork); 0 where the kernel does not say."""
    try:
        return int(iso.read_small(f"/proc/{pid}/schedstat").split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Zygote:
    """One zygote's executions, one at a time: fork, watch, clean up, judge."""

    def __init__(self, config: ZygoteConfig, confinement: Confinement,
                 buffer: payload.Payload | None = None) -> None:  # fmt: skip
        self.config = config
        self.confinement = confinement
        self.payload = buffer or payload.Payload(self.result_room)
        self.pid = os.getpid()
        self.dirty = False
        # In a pid namespace every zygote is pid 1: a random tag names its run directories.
        self.workdirs = WorkDirs(
            config,
            private_tmp=confinement.mount,
            own_uid=confinement.uid,
            scratch_keep=confinement.scratch_keep,
            ipc=confinement.ipc,
            mq_fd=confinement.mq_fd,
            run_tag=os.urandom(4).hex() if confinement.pid else str(self.pid),
        )
        self.unclean: str | None = None  # why the last reset failed: the zygote is recycled

    @property
    def result_room(self) -> int:
        """What a result needs of the payload buffer: both output streams, one byte over, and
        the files a run may send back (address space only, until a run collects some)."""
        return result_room(self.config)

    def receive(self, sock: socket.socket) -> dict[str, Any] | None:
        """The next request, its payload in the buffer; a larger buffer is a larger address
        space in every child, which the limit then leaves out as it does the interpreter."""
        size = self.payload.size
        message = payload.receive(sock, self.payload, self.result_room)
        self.confinement.base_address_space += self.payload.size - size
        return message

    def _reset_workdir(self, workdir: str) -> None:
        """Leave nothing of this execution for the next one; a slot that cannot is recycled."""
        why = self.workdirs.clean(workdir)
        if why is not None:
            self.unclean = why
            self.dirty = True

    def _fork(self, spec: RunSpec[memoryview], pipes: monitor.Pipes, workdir: str) -> int:
        pid = os.fork()
        if pid == 0:
            child.start(spec, pipes, self.config, self.confinement, workdir, self.pid, self.payload)
        return pid

    def _clean_up(self, pid: int) -> tuple[int, Any]:
        """Kill whatever is left of the execution, reap it all; (wait status, rusage)."""
        try:
            os.killpg(pid, signal.SIGKILL)  # the child is at worst a zombie: its pgid is ours
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(pid, 0)
        adopted = self.confinement.adopts_orphans
        if not adopted or iso.my_children():  # escaped the group (setsid, double fork)
            if self.confinement.uid and self.config.uid is not None:
                iso.kill_all_of_uid(self.config.uid)
            if not iso.kill_descendants(time.monotonic() + CLEANUP_GRACE_S):
                self.dirty = True
        return status, usage

    def _collect(
        self, patterns: list[str], workdir: str
    ) -> tuple[memoryview | bytes, list[tuple[str, int]]]:
        """The files at the top of ``workdir`` that ``patterns`` match, read into the payload
        buffer (wiped after the result is sent: nothing of them stays in this heap), with
        their names and sizes. Every process of the run is dead by now. Only plain files with
        one link count, opened without following a link: what the run left there is the
        run's, but a link could name a file only this process may read. What would take more
        than ``MAX_ARTIFACTS_BYTES`` is left out (the caller finds it missing)."""
        if not patterns:
            return b"", []
        with os.scandir(workdir) as entries:
            names = sorted(e.name for e in entries if _matches(e.name, patterns))
        found: list[tuple[str, int, int]] = []
        total = 0
        try:
            for name in names:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                try:
                    fd = os.open(os.path.join(workdir, name), flags)
                except OSError:  # a link (ELOOP), or gone
                    continue
                info = os.fstat(fd)
                plain = stat.S_ISREG(info.st_mode) and info.st_nlink == 1
                if not plain or total + info.st_size > protocol.MAX_ARTIFACTS_BYTES:
                    os.close(fd)
                    continue
                found.append((name, info.st_size, fd))
                total += info.st_size
            view = self.payload.take(total)
            at = 0
            for _, size, fd in found:
                end = at + size
                while at < end and (n := os.readv(fd, [view[at:end]])) > 0:
                    at += n
                at = end  # nothing of the run is left to write it: a short read stays zeros
        finally:
            for _, _, fd in found:
                os.close(fd)
        return view, [(name, size) for name, size, _ in found]

    def execute(self, spec: RunSpec[memoryview]) -> Outcome[memoryview]:
        timeout_s, memory_mb = spec.limits.timeout_s, spec.limits.memory_mb
        workdir = self.workdirs.make()
        stdin = spec.stdin if isinstance(spec.stdin, memoryview) else b""  # "": none sent
        pipes = monitor.Pipes.open(stdin)
        sampler = None
        if self.confinement.cgroup is not None:
            self.confinement.cgroup.begin(memory_mb)
        else:
            sampler = memory.TreeSampler(memory_mb, memory.resident_bytes())
        cpu_before = _tree_cpu_s()
        start = time.monotonic()
        pid = self._fork(spec, pipes, workdir)
        pipes.close_child_ends()
        ended = self.confinement.exit_watch(pid)
        cap = self.config.max_output_bytes
        streams = {
            pipes.out_r: monitor.Capture(cap, self.payload.take(cap + 1)),
            pipes.err_r: monitor.Capture(cap, self.payload.take(cap + 1)),
        }
        try:
            cgroup = self.confinement.cgroup
            over: monitor.Sampler | None = None
            finish: Callable[[], memory.MemoryOutcome | None]
            if cgroup is not None:
                alarm, finish = cgroup.oom_alarm, cgroup.end
            else:
                assert sampler is not None
                alarm, over, finish = None, sampler.over, sampler.outcome
            extension = self.config.starved_extension * timeout_s
            waited = functools.partial(_runqueue_wait_s, pid) if extension else None
            seen = monitor.watch(ended, streams, timeout_s, start, alarm, over, waited, extension)
            status, usage = self._clean_up(pid)
            if sampler is not None:
                sampler.reaped(usage.ru_maxrss * 1024)
            tree = finish()
            monitor.drain(streams)
            os.set_blocking(pipes.st_r, False)
            try:
                note = os.read(pipes.st_r, 4096)
            except BlockingIOError:
                note = b""
            artifacts, index = self._collect(spec.collect, workdir)
        finally:
            ended.close()
            pipes.close_parent_ends()
            self._reset_workdir(workdir)
        out, err = streams[pipes.out_r], streams[pipes.err_r]
        tree_cpu = _tree_cpu_s() - cpu_before
        observed = judge.Observed(
            wait_status=status,
            watch=seen,
            setup_note=note,
            tree_cpu_s=tree_cpu,
            cpu_limit_s=child.cpu_limit_s(timeout_s),
            memory_mb=memory_mb,
            timeout_s=timeout_s,
            tree=tree,
        )
        verdict_, code, sig, message = judge.verdict(observed, [out, err])
        return Outcome(
            status=verdict_,
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
            artifacts=artifacts,
            artifact_index=index,
        )

    def leave_nothing(self) -> None:
        """Before this zygote exits: kill and reap whatever an execution left (after a failed
        clean-up), which would otherwise be re-parented past it and run on."""
        if self.confinement.uid and self.config.uid is not None:
            iso.kill_all_of_uid(self.config.uid)
        iso.kill_descendants(time.monotonic() + CLEANUP_GRACE_S)


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
            print(f"zygote of slot {zygote.config.slot}: recycled: {why}", file=sys.stderr)
        protocol.send(sock, result.frame())
        del msg, result  # their views into the payload buffer
        zygote.payload.wipe()
        if zygote.dirty:
            return  # go-judge's rule: never reuse an environment that failed to reset


def start_up(config: ZygoteConfig, sock: socket.socket) -> Zygote:
    """Every start-up step, each named in the ``StartFailed`` that stops it."""
    with startup.step("death signal"):
        iso.die_with_parent()
    with startup.step("non-dumpable"):
        iso.set_dumpable(False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the service, which stops us
    pid_note = startup.enter_pid_namespace(config, sock)
    with startup.step("confinement"):
        confinement = startup.confine_zygote(config)
    confinement.pid = startup.in_own_pid_namespace()
    with startup.step("orphans"):
        startup.adopt_orphans(confinement)
    with startup.step("waiting for children"):
        confinement.exit_watch, why = monitor.exit_watcher()
    if why:
        confinement.notes["pidfd"] = why
    if confinement.pid and not confinement.mount:
        with startup.step("own /proc of the pid namespace"):
            startup.mount_own_proc(confinement)  # never the host's /proc seen from in here
    if pid_note:
        confinement.notes["pid"] = pid_note
    with startup.step("gVisor"):
        startup.gvisor_quirks(confinement, config.max_processes)
    with startup.step("credentials"):
        startup.check_secrets_hidden(config, confinement)
    failed = startup.preload(config.preload, config.warmup)
    if not confinement.mount:
        with startup.step("working directory"):
            prepare_slot_dir(config)
    os.environ.clear()
    os.environ.update(child.environment("/tmp" if confinement.mount else config.work_root))
    child.prepare_streams()
    gc.collect()
    gc.freeze()  # children's collections then leave the preloaded objects (and their pages) alone
    huge_mb = iso.collapse_heap_into_huge_pages()
    buffer = payload.Payload(result_room(config))  # before the address space is read
    mem = iso.memory_status()
    confinement.base_address_space = mem.get("VmSize", 0)
    if not confinement.uid or confinement.nproc_counts_all:
        processes = iso.count_processes_of(None if confinement.nproc_counts_all else os.getuid())
        confinement.shared_process_limit = processes + 4 * config.max_processes
    report = StartReport(
        pid=os.getpid(),
        isolation=confinement.report(),
        preload_failed=failed,
        rss_mb=round(mem.get("VmRSS", 0) / MIB, 1),
        address_space_mb=round(confinement.base_address_space / MIB, 1),
        huge_pages_mb=huge_mb,
        cgroup=confinement.cgroup.path if confinement.cgroup is not None else None,
    )
    protocol.send(sock, report.frame())
    return Zygote(config, confinement, buffer=buffer)


def main(argv: list[str]) -> None:
    if sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]  # Python 3.10 (no -P): the directory we were started in is not ours
    config = ZygoteConfig(**json.loads(argv[0]))
    sock = socket.socket(fileno=int(argv[1]))
    try:
        zygote = start_up(config, sock)
    except Exception as exc:  # the slot reports it as is: the step, the call and its errno
        why = str(exc) if isinstance(exc, startup.StartFailed) else f"{type(exc).__name__}: {exc}"
        print(f"zygote of slot {config.slot}: cannot start: {why}", file=sys.stderr)
        protocol.send(sock, StartFailure(why).frame())
        sys.exit(1)
    try:
        serve(sock, zygote)
    finally:
        zygote.leave_nothing()


if __name__ == "__main__":
    main(sys.argv[1:])
