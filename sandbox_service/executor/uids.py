"""Slot uids are claimed per host, so two services on one machine never share one.

Slot i of a service run as root executes code as ``uid_base + i``, and a zygote kills every
process of its uid when it starts (the leftovers of a predecessor). Two services with the
same range would kill each other's executions and share each uid's process limit, silently.
A service therefore claims each of its uids before its zygotes start, by binding an
abstract Unix socket named after the uid: the kernel holds the name exactly as long as the
process lives, so a crashed service leaves no stale claim and no file to clean up. Abstract
names are per network namespace, which is the scope that matters: services in separate
containers have separate process tables too.

A ``uid_base`` left at its default moves to the next free range when its own is taken (with
a warning); one that was set explicitly is a start-up error naming the uid in use.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field

from sandbox_service.executor.slot import SlotStartError

log = logging.getLogger(__name__)

SEARCH_RANGES = 256  # ranges tried above a default uid_base before giving up
MAX_UID = 2**31 - 2


class UidsInUse(SlotStartError):
    """The slot uids this service was told to use belong to another live service."""


@dataclass
class UidClaim:
    base: int
    count: int
    _held: list[socket.socket] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for s in self._held:
            s.close()
        self._held.clear()


def _name(uid: int) -> bytes:
    return f"\0sandbox-service/slot-uid/{uid}".encode()


def _claim_range(base: int, count: int) -> UidClaim | int:
    """All of ``base .. base+count-1``, or the first uid another process holds."""
    held: list[socket.socket] = []
    for uid in range(base, base + count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(_name(uid))
        except OSError:
            s.close()
            for h in held:
                h.close()
            return uid
        held.append(s)
    return UidClaim(base, count, held)


def claim(base: int, count: int, movable: bool) -> UidClaim:
    """Claim ``count`` uids from ``base``; if ``movable``, from the first free range above."""
    tries = SEARCH_RANGES if movable else 1
    for attempt in range(tries):
        start = base + attempt * count
        if start + count - 1 > MAX_UID:
            break
        got = _claim_range(start, count)
        if isinstance(got, UidClaim):
            if attempt:
                log.warning("slot uids %d-%d are in use by another service on this host: "
                            "using %d-%d instead (set uid_base to choose)",
                            base, base + count - 1, start, start + count - 1)  # fmt: skip
            return got
        taken = got
    if not movable:
        raise UidsInUse(
            f"slot uid {taken} (uid_base {base}, {count} slots) is in use by another "
            "sandbox service on this host; give each service its own range "
            f"(--uid-base, e.g. {base + 1000})"
        )
    raise UidsInUse(f"no free range of {count} slot uids above {base}; set uid_base")
