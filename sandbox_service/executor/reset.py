"""Between two executions of a zygote: leave nothing of the first for the second.

What an execution can leave is files (the slot's private ``/tmp`` and ``/dev/shm``, or its run
directory without the mount layer) and IPC objects (``executor.ipc``). The reset removes both
once every process of the execution is dead, and says whether it succeeded; it never raises,
whatever the program made (``RecursionError`` from a deep tree included), because a zygote
that cannot prove it is clean must be recycled, never reused (go-judge's rule).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sandbox_service.executor import ipc, wipe


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
