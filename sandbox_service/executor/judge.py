"""The verdict of one execution, from what the zygote observed itself and nothing the program said.

The program controls its own output, exit code and signals: it can print a traceback it never
raised, exit 125, or send itself SIGXCPU or SIGKILL. None of that may turn into a status that
says the service or one of its limits ended the run (``internal_error``, ``timeout``,
``memory_limit``): trainers retry or mask those instead of penalising them, so a program that
could claim them would forge its own reward. So each such status needs a fact the parent saw:

- ``internal_error``: a setup failure, written on the status pipe before user code runs (the
  child closes the pipe first thing after setup, see ``child.close_setup_channel``);
- ``timeout``: the zygote's own clock, or SIGXCPU with the tree's CPU time (the kernel's
  accounting of every process reaped) at the CPU limit;
- ``memory_limit``: the limit was enforced or passed: the memory cgroup counted an OOM kill
  during the run, or (without one) the parent's sampling found the tree over the limit and
  killed it, or the kernel's high-water mark of one reaped process is above the limit
  (``memory.TreeSampler``; what the cgroup would have killed). Nothing else: a run that
  failed while large but within the limit is ``error`` (a program can fill memory and then
  fail on purpose), and so is a ``MemoryError``, which the parent cannot tell from one the
  program raised itself; the address-space limit is only a backstop far above ``memory_mb``
  (``memory.address_space``), so that what reaches the limit meets the cgroup or the sampler
  first;
- ``output_limit``: the zygote's own count of captured bytes.

Anything else the program did to itself (a signal, an exit code) is ``error`` or ``ok``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from sandbox_service.executor.memory import MemoryOutcome
from sandbox_service.executor.monitor import SETUP_ERROR, Capture, Watch
from sandbox_service.executor.protocol import RunStatus

CPU_REACHED = 0.99  # rusage is exact, the kernel checks RLIMIT_CPU per tick
Verdict = tuple[RunStatus, int | None, int | None, str]  # status, exit code, signal, why


@dataclass(frozen=True)
class Observed:
    """What the zygote itself saw of one execution."""

    wait_status: int
    watch: Watch
    setup_note: bytes  # what the child wrote before user code ran (empty once it ran)
    tree_cpu_s: float  # CPU of every process of the execution that the zygote reaped
    cpu_limit_s: float  # RLIMIT_CPU of each process
    memory_mb: int  # the request's memory limit above the interpreter
    timeout_s: float
    tree: MemoryOutcome | None = None  # the cgroup's or the sampler's view of the whole tree


def _signalled(sig: int, seen: Observed) -> tuple[RunStatus, str]:
    name = signal.Signals(sig).name
    if sig == signal.SIGXCPU and seen.tree_cpu_s >= CPU_REACHED * seen.cpu_limit_s:
        return RunStatus.timeout, f"CPU-time limit of {seen.cpu_limit_s:g} s exceeded"
    return RunStatus.error, f"terminated by {name} (not sent by the service)"


def verdict(seen: Observed, outputs: list[Capture]) -> Verdict:
    """(status, exit_code, signal, message) of one execution."""
    judged, code, sig, message = _by_process(seen, outputs)
    tree = seen.tree
    # The tree went over together (the kernel killed one of its processes for the limit, or
    # the sampler all of them): unless a limit the parent enforces ended the run first.
    if tree is not None and tree.oom_killed and judged in (RunStatus.ok, RunStatus.error):
        why = f"memory limit of {seen.memory_mb} MiB exceeded by the execution's processes"
        return RunStatus.memory_limit, code, sig, f"{why} together ({tree.how})"
    return judged, code, sig, message


def _by_process(seen: Observed, outputs: list[Capture]) -> Verdict:
    """The verdict from how the child ended and what the parent enforced, the tree aside."""
    status = seen.wait_status
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    if seen.setup_note.startswith(SETUP_ERROR):
        return RunStatus.internal_error, code, sig, seen.setup_note.decode(errors="replace").strip()
    if seen.watch.reason == "timeout":
        why = f"wall-clock limit of {seen.timeout_s:g} s exceeded"
        if seen.watch.extended_s >= 0.001:
            why += f" (extended by {seen.watch.extended_s:.3f} s spent waiting for a CPU)"
        return RunStatus.timeout, code, sig, why
    if seen.watch.reason == "output" or any(c.truncated for c in outputs):
        cap = outputs[0].cap
        return RunStatus.output_limit, code, sig, f"output exceeded {cap} bytes per stream"
    if sig is not None:
        judged, why = _signalled(sig, seen)
        return judged, code, sig, why
    return (RunStatus.ok if code == 0 else RunStatus.error), code, sig, ""
