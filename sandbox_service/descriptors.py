"""The process's descriptor limit, raised where a node starts (API and worker alike).

A soft ``RLIMIT_NOFILE`` of 1,024 (a common default) is reached by 1,100 idle client sockets,
or by a few hundred slots' pipes, and then every new client or slot is refused; the hard limit
is ours to take.
"""

from __future__ import annotations

import resource

UNLIMITED_AS = 1 << 20  # the soft limit asked for when the hard one is unlimited


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, UNLIMITED_AS)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft
