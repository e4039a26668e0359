"""Every Redis key of the service, in one place: the whole schema reads in one screen.

Nothing else spells a key. With the default prefix ``sandbox`` the job stream is
``sandbox:jobs`` and its consumer group ``workers``: the Kubernetes manifests (KEDA's
redis-streams scaler) read those two names, so change them only together.

=============================  ==========  =====================================================
key                            type        what
=============================  ==========  =====================================================
``{p}:jobs``                   stream      chunks of jobs to run, waiting or held; group
                                           ``workers`` holds the pending list (entries are
                                           claimed by ``take``, never read with ``>``). Fields:
                                           ``n`` jobs, ``reply`` stream, ``tenant``, ``jobs``
                                           (a JSON list). Settled entries are deleted.
``{p}:ready:<tenant>``         list        ``n|entry id`` of a tenant's chunks no worker holds,
                                           oldest first (put-back ones at the head)
``{p}:active``                 sorted set  tenants with ready chunks, by virtual time
``{p}:fair``                   hash        per tenant ``vtime:``, ``mean:`` (run time per job),
                                           ``weight:``, ``cap:`` (max_in_flight), ``queued:``
                                           (waiting+running), ``running:`` (held by workers);
                                           ``clock``: the virtual time of the last choice
``{p}:wake``                   list        the bell: a token per chunk no worker took yet;
                                           an idle worker blocks on it (BLMOVE), so
                                           one chunk wakes one worker
``{p}:woke:<name>``            list        the token that woke a worker, until its take
                                           (run right after, in the same round trip) drops it
``{p}:depth``                  string      jobs admitted and not yet settled (waiting+running)
``{p}:epoch``                  string      random token set once; a new one means Redis lost
                                           its data (restarted empty): in-flight work is gone
``{p}:stats``                  hash        ``reclaimed``, ``executions:<status>`` cluster counts
``{p}:workers``                set         names of workers that sent a heartbeat
``{p}:worker:<name>``          string      a worker's last heartbeat (JSON), expires when it dies
``{p}:replies:<node>``         stream      results for the API node ``node`` (field: job key)
``{p}:result:<t>:<id>``        string      stored result of tenant t's request ``id`` (TTL)
``{p}:claim:<t>:<id>``         string      job key of the running job with that ``id``
``{p}:waiters:<t>:<id>``       set         reply streams of other API nodes waiting on it
``{p}:mark:<link>``            string      a counter each node's connection raises with every
                                           write: one that went back means Redis lost writes
=============================  ==========  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "sandbox"
GROUP = "workers"  # the consumer group of the job stream


@dataclass(frozen=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def fair(self) -> str:
        return f"{self.prefix}:fair"

    @property
    def active(self) -> str:
        return f"{self.prefix}:active"

    @property
    def bell(self) -> str:
        return f"{self.prefix}:wake"  # a list; ``:bell`` was a stream (older versions)

    def woke(self, worker: str) -> str:
        return f"{self.prefix}:woke:{worker}"

    def ready(self, tenant: str) -> str:
        return f"{self.prefix}:ready:{tenant}"

    @property
    def depth(self) -> str:
        return f"{self.prefix}:depth"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}:epoch"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    @property
    def abandoned(self) -> str:
        """Sorted set: keys of jobs whose client went away, scored by when to forget them."""
        return f"{self.prefix}:abandoned"

    def replies(self, node: str) -> str:
        return f"{self.prefix}:replies:{node}"

    def result(self, request_id: str) -> str:
        return f"{self.prefix}:result:{request_id}"

    def claim(self, request_id: str) -> str:
        return f"{self.prefix}:claim:{request_id}"

    def waiters(self, request_id: str) -> str:
        return f"{self.prefix}:waiters:{request_id}"

    def mark(self, link: str) -> str:
        return f"{self.prefix}:mark:{link}"

    def of_id(self, request_id: str) -> list[str]:
        """The three keys of an idempotent request, in the order the scripts expect;
        ``request_id`` is scoped to its tenant (``queue.base.scoped``)."""
        return [self.result(request_id), self.claim(request_id), self.waiters(request_id)]


FAIR_QUEUED = "queued:"  # + tenant: fields of the fair hash the API nodes read
FAIR_RUNNING = "running:"
STATS_RECLAIMED = "reclaimed"
STATS_EXECUTIONS = "executions:"  # + status
