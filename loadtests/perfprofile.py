"""perf profiles of a benchmark mode: recorded around its measured part, read back by role.

``ProfiledMeter`` is a ``cpu.Meter`` that also runs ``perf record -F 999 -g`` attached to the
mode's processes from ``begin`` to ``end`` (their children, the executions, are followed as
they are forked); ``top`` reads the record back with ``perf report`` as each role's share of
the samples and its hottest symbols, ``[k]`` kernel or ``[.]`` user space. The records stay
on disk for ``perf report -i FILE`` (call graphs included). Needs ``perf`` and the right to
attach to those processes (root here). CPython 3.11 gives perf no Python frames: user time
shows as the interpreter's C functions.

Read the split within a role, not the shares between roles: an execution lives a few
milliseconds and perf samples a task that young too seldom (here the children had 39 % of
the samples of a floor run and 67 % of its CPU by ``/proc``); ``cpu`` has the totals.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field

from loadtests.cpu import Meter, PerExecution, Reading

ATTACH_S = 1.0  # perf prints nothing once attached; this is how long it takes here, loaded
LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\d+):\S*\s+(\[.\])\s+(.+?)\s*$")
TOP = 6


@dataclass
class Profile:
    name: str
    path: str
    roles: dict[str, float] = field(default_factory=dict)  # role -> % of the samples
    symbols: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    kernel: float = 0.0  # % of all samples in the kernel
    pids: dict[int, str] = field(default_factory=dict)  # pid -> role; any other: the default

    def lines(self) -> list[str]:
        out = [f"{self.name}: {self.kernel:.0f}% of samples in the kernel; record {self.path}"]
        for role, share in sorted(self.roles.items(), key=lambda kv: -kv[1]):
            hot = ", ".join(f"{sym} {pct:.1f}" for sym, pct in self.symbols.get(role, []))
            out.append(f"  {role:9} {share:5.1f}%  {hot}")
        return out


def top(path: str, role_of: dict[int, str], name: str, default: str = "children") -> Profile:
    """Role shares and the ``TOP`` symbols of each (percent of all samples), from a record."""
    report = subprocess.run(
        # No --percent-limit: each execution is a pid of its own, with a sliver of the samples.
        # Sample counts, not perf's rounded percentages: thousands of slivers add up wrong.
        ["perf", "report", "-i", path, "--no-children", "--sort", "pid,sym", "-g", "none", "-q",
         "-n"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    profile = Profile(name, path, pids=dict(role_of))
    by_role: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    kernel = total = 0
    for line in report.stdout.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        samples, pid, space, sym = int(match[1]), int(match[2]), match[3], match[4]
        by_role[role_of.get(pid, default)][f"{space} {sym}"] += samples
        kernel += samples if space == "[k]" else 0
        total += samples
    pct = 100 / max(total, 1)
    profile.kernel = round(kernel * pct, 1)
    for role, symbols in by_role.items():
        profile.roles[role] = round(sum(symbols.values()) * pct, 1)
        ranked = sorted(symbols.items(), key=lambda kv: -kv[1])[:TOP]
        profile.symbols[role] = [(sym, round(n * pct, 1)) for sym, n in ranked]
    return profile


@dataclass
class ProfiledMeter(Meter):
    """A meter that also records a perf profile into ``path``; the profile goes to ``sink``."""

    path: str = ""
    name: str = ""
    sink: list[Profile] = field(default_factory=list)
    _perf: subprocess.Popen[bytes] | None = None
    _role_of: dict[int, str] = field(default_factory=dict)

    def begin(self) -> None:
        reading = self.roles.read()
        self._role_of = self._roles_of(reading)
        pids = ",".join(map(str, self._role_of))
        self._perf = subprocess.Popen(
            ["perf", "record", "-q", "-F", "999", "-g", "-p", pids, "-o", self.path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(ATTACH_S)
        super().begin()

    def _roles_of(self, reading: Reading) -> dict[int, str]:
        """pid -> role of what to attach to: all but the client, unless the executions are
        the client's own children (the naive baseline)."""
        skip = set() if self.roles.children == "client" else {"client"}
        return {pid: role for role, procs in reading.items() if role not in skip for pid in procs}

    def end(self, n: int) -> tuple[PerExecution, float | None]:
        result = super().end(n)
        if self._perf is not None:
            self._perf.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._perf.wait(60)
            if self._perf.poll() is None:
                self._perf.kill()
            self.sink.append(top(self.path, self._role_of, self.name))
            self._perf = None
        return result
