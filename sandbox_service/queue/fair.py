"""Weighted fair sharing of the slots between tenants: whose job runs next.

Each tenant has a virtual time, the slot-seconds it was given divided by its weight; the next
job goes to the tenant with work whose virtual time is lowest. A job is charged when it starts
with its tenant's recent mean run time (so that a flood of long jobs is charged before they
end, not after) and corrected by what it really took once it ends. A tenant that comes back
from idle starts at the current virtual clock: idle time earns no credit. This is start-time
fair queueing charged with measured run time: among tenants with work, slot time goes in
proportion to weight whatever each job costs, which deficit round robin by job count does not
give when one tenant's programs run 100 times longer than another's. The Redis queue's
``take`` script (``queue.redis.scripts``) does the same arithmetic in Redis, so every worker
shares one clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

INITIAL_MEAN_S = 0.01  # a new tenant's first jobs are charged this until measured
EWMA = 0.2  # weight of the newest run time in a tenant's mean


@dataclass
class Share:
    vtime: float = 0.0
    mean_s: float = INITIAL_MEAN_S


class FairShare:
    """Virtual times per tenant, and the clock a tenant that wakes up starts from."""

    def __init__(self) -> None:
        self.shares: dict[str, Share] = {}
        self.clock = 0.0

    def activate(self, name: str) -> None:
        """``name`` has work again: it resumes no earlier than the clock."""
        share = self.shares.setdefault(name, Share())
        share.vtime = max(share.vtime, self.clock)

    def pick(self, names: Iterable[str]) -> str | None:
        best, low = None, 0.0
        for name in names:
            vtime = self.shares[name].vtime
            if best is None or vtime < low:
                best, low = name, vtime
        return best

    def charge(self, name: str, weight: float, jobs: int = 1) -> float:
        """``name`` starts ``jobs`` jobs: advance the clock and its virtual time by the estimate;
        returns the estimate, to correct once they end."""
        share = self.shares[name]
        self.clock = share.vtime
        estimate = jobs * share.mean_s
        share.vtime += estimate / weight
        return estimate

    def settle(self, name: str, weight: float, jobs: int, estimate: float, took: float) -> None:
        share = self.shares.setdefault(name, Share())
        share.vtime += (took - estimate) / weight
        if jobs:
            share.mean_s += EWMA * (took / jobs - share.mean_s)
