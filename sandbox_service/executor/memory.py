"""An execution's memory, limited and measured as a whole: a memory cgroup per zygote.

``RLIMIT_AS`` bounds each process alone: ten forked children of 110 MiB each pass a limit of
128 MiB. Where the host has a memory controller (cgroup v1 ``memory``, or v2 with ``memory``
delegated), each zygote moves itself into a cgroup of its own at start (once: moving a process
between cgroups waits for an RCU grace period, ~20 ms at p90 here, far too slow per child) and
its children are born in it. Before each fork the zygote sets the limit to what the cgroup
holds of its own plus ``memory_mb``, so the execution's processes together can add no more than
that (pages still shared with the zygote are the zygote's and cost nothing); the kernel
enforces it with its OOM killer. "Of its own" leaves out the page cache no process maps: files
that earlier executions read (or dropped and read again) stay charged to the cgroup after they
end, and a limit set above them would give every later execution that much more (issue 30:
~1.2 GiB). Setting the limit below the usage makes the kernel reclaim that cache first (v1;
v2 through ``memory.reclaim``), only when there is some. The zygote itself is not the one
taken: each child raises its ``oom_score_adj`` to 1000 before dropping root, and the zygote
lowers its own to -1000 where it may (CAP_SYS_RESOURCE). After the run the limit goes back to
unlimited so that the zygote's own work between runs never meets it.

The verdict is the parent's own observation (``judge.py`` decides it from ``MemoryOutcome``): an
OOM kill counted in the cgroup during the run means ``memory_limit``, whatever the processes
exited with; the peak is the cgroup's high-water
mark above what it held before the fork: the memory the whole tree added.

The control files are opened before the zygote's mount namespace makes ``/sys`` read-only;
the descriptors stay writable. Without a memory controller (or root) this module reports why,
and the parent samples the tree instead (``TreeSampler``); each process's address space is
limited only as a backstop (``address_space``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from sandbox_service.executor import isolation as iso

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
UNLIMITED_V1 = b"-1"
OOM_PROTECTED = b"-1000"
OOM_FIRST = b"1000"
# Usage up to this above the cgroup's own memory, as last read in ``memory.stat`` (~45 us a
# read), is neither read again nor reclaimed: it lies inside the next run's limit (a run may
# find up to this much less room, never more).
RECLAIM_FROM = 4 * MIB


@dataclass(frozen=True)
class MemoryOutcome:
    """What the cgroup saw of one execution."""

    peak_mb: float
    oom_killed: bool  # the tree went over: the kernel killed a process, or the sampler all
    how: str = "their cgroup ran out of memory"


def memory_cgroup() -> tuple[int, str]:
    """(cgroup version, directory of this process's memory cgroup), or OSError."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            for m in mounts:
                sep = m.index("-")
                if m[sep + 1] == "cgroup" and "memory" in m[sep + 3].split(","):
                    return 1, _under_mount(m[4], m[3], path)
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and controllers == "":
            for m in mounts:
                if m[m.index("-") + 1] == "cgroup2":
                    # A v2 cgroup with processes cannot have controlled children (but the
                    # root): the zygote's goes beside the one it was started in.
                    directory = _under_mount(m[4], m[3], path)
                    parent = directory if path == "/" else os.path.dirname(directory)
                    with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                        if "memory" in f.read().split():
                            return 2, parent
                    raise OSError(f"cgroup v2 at {parent} does not delegate the memory controller")
    raise OSError("no memory cgroup controller on this host")


def _under_mount(mountpoint: str, root: str, path: str) -> str:
    """Where cgroup ``path`` (as /proc/self/cgroup names it) is under a mount of ``root``."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return mountpoint + path.rstrip("/")


class SlotCgroup:
    """The zygote's own memory cgroup, through descriptors opened at start."""

    def __init__(self, name: str) -> None:
        """Create cgroup ``name`` beside (v2) or below (v1) the zygote's own and move into
        it; OSError when the host has no memory controller this process may use."""
        self.version, parent = memory_cgroup()
        self.path = os.path.join(parent, name)
        os.makedirs(self.path, exist_ok=True)
        v1 = self.version == 1
        self._usage = self._open("memory.usage_in_bytes" if v1 else "memory.current", os.O_RDONLY)
        self._limit = self._open("memory.limit_in_bytes" if v1 else "memory.max", os.O_WRONLY)
        self._peak = self._open("memory.max_usage_in_bytes" if v1 else "memory.peak", os.O_RDWR)
        self._events = self._open("memory.oom_control" if v1 else "memory.events", os.O_RDONLY)
        self._stat = self._open("memory.stat", os.O_RDONLY)
        self._reclaim: int | None = None  # v2 since Linux 5.19: reclaim on request
        if not v1 and os.path.exists(os.path.join(self.path, "memory.reclaim")):
            self._reclaim = self._open("memory.reclaim", os.O_WRONLY)
        # v1 signals every OOM of the cgroup on an eventfd: the parent ends the execution at
        # once (a multiprocessing pool whose worker was killed would otherwise wait for ever).
        self.oom_alarm: int | None = None
        if v1:
            self.oom_alarm = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            with open(os.path.join(self.path, "cgroup.event_control"), "w") as f:
                f.write(f"{self.oom_alarm} {self._events}")
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write("0")  # this process (its pid here may be 1, in a namespace of its own)
        try:  # lowering needs CAP_SYS_RESOURCE; children raise theirs to 1000 anyway
            with open("/proc/self/oom_score_adj", "wb") as f:
                f.write(OOM_PROTECTED)
        except PermissionError:
            pass
        self._baseline = 0
        self._oom_before = 0
        self._own = 0  # what the cgroup held of its own at the last memory.stat read (~45 us)

    def _open(self, name: str, flags: int) -> int:
        return os.open(os.path.join(self.path, name), flags | os.O_CLOEXEC)

    @staticmethod
    def _read(fd: int) -> bytes:
        return os.pread(fd, 4096, 0)

    def _oom_kills(self) -> int:
        for line in self._read(self._events).splitlines():
            key, _, value = line.partition(b" ")
            if key == b"oom_kill":
                return int(value)
        return 0

    def _drain_alarm(self) -> bool:
        """Whether the cgroup went out of memory since the last drain."""
        if self.oom_alarm is not None:
            try:
                return os.eventfd_read(self.oom_alarm) > 0
            except BlockingIOError:
                pass
        return False

    def _set_limit(self, value: bytes) -> None:
        os.pwrite(self._limit, value, 0)

    def _unmapped_cache(self) -> int:
        """Page cache of the cgroup that no process maps (shared memory and tmpfs are not in
        the file lists: they are no cache the kernel may drop)."""
        stat = dict(line.split() for line in os.pread(self._stat, 16384, 0).splitlines())
        files = int(stat.get(b"active_file", 0)) + int(stat.get(b"inactive_file", 0))
        mapped = int(stat.get(b"mapped_file" if self.version == 1 else b"file_mapped", 0))
        return max(files - mapped, 0)

    def begin(self, memory_mb: int) -> None:
        """Before the fork: the tree may add ``memory_mb`` to what the cgroup holds of its own,
        whatever cache earlier executions left in it (reclaimed now)."""
        usage = int(self._read(self._usage))
        own = min(self._own, usage)  # the zygote may have shrunk: never above the usage
        if usage > own + RECLAIM_FROM:  # else what is over is counted against this run's share
            own = self._own = usage - self._unmapped_cache()
        if usage - own > RECLAIM_FROM:  # reclaimed, not only limited: the peak is the run's
            with contextlib.suppress(OSError):  # EBUSY or EAGAIN: less could be reclaimed
                if self._reclaim is not None:
                    os.pwrite(self._reclaim, str(usage - own).encode(), 0)
                elif self.version == 1:  # v1 reclaims down to a limit set below the usage
                    self._set_limit(str(own).encode())
        self._oom_before = self._oom_kills()
        self._drain_alarm()  # an event of before the fork is no alarm
        limit = own + memory_mb * MIB
        if self.version == 2:  # below the usage, v2 would OOM-kill (the zygote too)
            limit = max(limit, int(self._read(self._usage)))
        try:
            self._set_limit(str(limit).encode())
        except OSError:  # v1, what could not be reclaimed: it stays inside the limit
            self._set_limit(str(max(limit, int(self._read(self._usage)))).encode())
        self._baseline = int(self._read(self._usage))
        if self._baseline + memory_mb * MIB < limit:  # usage fell since (a zygote that shrank,
            # cache reclaimed meanwhile): the run's share counts from here, or its peak above
            # the baseline could pass memory_mb (a loaded machine, 2026-12-05: 134.7 MB at 128)
            with contextlib.suppress(OSError):
                self._set_limit(str(self._baseline + memory_mb * MIB).encode())
        try:
            os.pwrite(self._peak, b"0" if self.version == 1 else b"reset", 0)
        except OSError:  # v2 before Linux 6.12: the peak is the cgroup's since it was made
            pass

    def end(self) -> MemoryOutcome:
        """After every process of the execution is dead: the tree's peak, whether the kernel
        killed one for the limit; the limit is lifted again."""
        self._set_limit(UNLIMITED_V1 if self.version == 1 else b"max")
        # The alarm counts too: the parent may have killed the tree before the kernel chose.
        over = self._drain_alarm() or self._oom_kills() > self._oom_before
        peak = int(self._read(self._peak)) - self._baseline
        return MemoryOutcome(round(max(peak, 0) / MIB, 3), over)


class TreeSampler:
    """Where there is no cgroup: the parent sums the private memory (USS: pages no other
    process maps) of every process of the tree, every ``monitor.SAMPLE_S``, and ends the run
    when it is over the limit. Approximate: growth between two samples goes unseen until the
    next, and pages shared only among the execution's own processes are not counted. So the
    kernel's high-water mark of the largest process (``wait4``'s ``ru_maxrss``) counts too,
    above what the zygote had resident at the fork (a lower bound of what that process added:
    a child starts with at most the zygote's pages): an allocation loop faster than the
    sampling (gVisor's ``/proc`` is slow, and a loaded container's parent too) otherwise
    meets the address-space backstop first, and a ``MemoryError`` the parent cannot tell
    from the program's own (CI's image step, 2026-12-05: ``error`` where ``memory_limit``)."""

    def __init__(self, memory_mb: int, resident_at_fork: int) -> None:
        self.limit = memory_mb * MIB
        self.resident_at_fork = resident_at_fork
        self.peak = 0
        self.over_limit = False
        self.how = "seen by sampling; all killed"

    def over(self) -> bool:
        total = sum(_private_bytes(pid) for pid in _descendants(os.getpid()))
        self.peak = max(self.peak, total)
        self.over_limit = total > self.limit
        return self.over_limit

    def reaped(self, largest_maxrss: int) -> None:
        """After every process is reaped: the largest one's high-water mark, in bytes."""
        added = largest_maxrss - self.resident_at_fork
        if added > self.limit and not self.over_limit:
            self.over_limit = True
            self.how = "one of them reached it, by the kernel's high-water mark"
        self.peak = max(self.peak, added)

    def outcome(self) -> MemoryOutcome | None:
        """None when nothing was measured (no sample, and no process grew)."""
        if self.peak <= 0:
            return None
        return MemoryOutcome(round(self.peak / MIB, 3), self.over_limit, self.how)


def resident_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``, ~10 us)."""
    return int(iso.read_small("/proc/self/statm").split()[1]) * PAGE


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (orphans come back to the zygote, a subreaper)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = [
                int(p) for p in iso.read_small(f"/proc/{parent}/task/{parent}/children").split()
            ]
        except OSError:
            continue
        found += kids
        todo += kids
    return found


def _private_bytes(pid: int) -> int:
    try:
        lines = iso.read_small(f"/proc/{pid}/smaps_rollup").splitlines()
    except OSError:  # gone meanwhile
        return 0
    total = 0
    for line in lines:
        if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
            total += int(line.split()[1]) * 1024
    return total


def peak_mb(tree: MemoryOutcome | None, largest_process_mb: float) -> float:
    """The execution's peak memory: the whole tree's where it was measured, else the largest
    process's (``wait4``). The verdict is ``judge``'s, which sees ``tree`` too."""
    return tree.peak_mb if tree is not None else largest_process_mb


# RLIMIT_AS of each process, above the zygote's address space: a backstop only, far above the
# limit, so that memory growing to ``memory_mb`` meets the cgroup's OOM kill or the sampler's
# (facts the parent sees) before a refused allocation (a MemoryError, which the parent cannot
# tell from one the program raised itself: judge.py).
ADDRESS_SPACE_ROOM = 2


def address_space(memory_mb: int) -> int:
    """What a child may map beyond the zygote's own address space."""
    return ADDRESS_SPACE_ROOM * memory_mb * MIB


def make_killable() -> None:
    """In a child, before it drops root: the first process the OOM killer takes (the zygote's
    -1000 is inherited and would make the child unkillable, and a cgroup at its limit with
    nothing to kill hangs until the timeout)."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, OOM_FIRST)
    finally:
        os.close(fd)


def cgroup_name(slot: int, uid: int | None) -> str:
    """Named after the slot's uid, unique on the host while its service lives (executor.uids);
    the next zygote of the slot finds and reuses it."""
    return f"sandbox-service-uid-{uid}" if uid is not None else f"sandbox-service-{os.getpid()}"


def remove_cgroup(path: str) -> bool:
    """Remove a zygote's cgroup once it is gone; False while a process is still in it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
