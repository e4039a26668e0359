"""A pid namespace per zygote: an execution finds no process but its own and its zygote.

``/proc`` already hides other processes (``hidepid``), but a pid can be probed without it:
``getpgid``, ``kill(pid, 0)`` and ``pidfd_open`` answer for any process of the host. In a pid
namespace of its own the zygote is pid 1 and an execution's processes are the only others, so
probing finds nothing else; and when the zygote dies, the kernel kills whatever is left in it.

A process cannot move itself into a new pid namespace, only its children are born in one, so
the zygote's process forks once at start: the child, pid 1 of the new namespace, becomes the
zygote; the parent stays as its *keeper*, which the service sees as the zygote (its pid, its
exit status, SIGKILL to it kills the zygote through ``PR_SET_PDEATHSIG``) and which holds
nothing but a bare interpreter. The namespace needs a ``/proc`` of its own (the zygote reads
its children there): it comes with the mount layer, or the zygote mounts one alone.
"""

from __future__ import annotations

import os
import signal

from sandbox_service.executor import isolation as iso

CLONE_NEWPID = 0x20000000


def enter(sock_fd: int) -> None:
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


def inside() -> bool:
    """Whether this process is the init of a pid namespace (the zygote after ``enter``)."""
    return os.getpid() == 1


def own_proc() -> None:
    """A /proc showing this namespace, for a zygote without the mount layer."""
    iso.unshare(iso.CLONE_NEWNS)
    iso.mount("none", "/", None, iso.MS_REC | iso.MS_PRIVATE, None)
    iso.private_proc()
