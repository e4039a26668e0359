"""A Redis-mode deployment on this machine, for load and fault runs: a throwaway Redis, API
nodes and worker nodes, each a real ``sandbox-service`` process on its own loopback port.

Every node can be killed (SIGKILL, as a crash) and started again in its place: an API node on
its old port, so clients that knew it find it again; a worker node under its old name and
name. Slot uids follow each node's port (``launch.start``), so no two live workers share one
(a zygote kills every process of its uid when it starts). All nodes share ``settings``
(names of Settings fields). ``sentinel``: Redis is a primary, a replica and three Sentinels
(``sentinel_process``) that the nodes follow, and ``fail_over`` kills the primary.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox_service.sentinel_process import MASTER, SentinelGroup
from sandbox_service.service_process import RedisServer, ServiceProcess, start


@dataclass
class Node:
    kind: str  # "api" or "worker"
    name: str
    settings: dict[str, Any]
    process: ServiceProcess | None = None
    restarts: int = 0
    uids: list[int] = field(default_factory=list)  # slot uids of every incarnation

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.process.pid


@dataclass
class Cluster:
    directory: str
    api_nodes: int = 1
    workers: int = 1
    slots: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    sentinel: bool = False
    redis: RedisServer = field(init=False)
    group: SentinelGroup | None = field(init=False, default=None)
    nodes: list[Node] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.api_nodes < 1 or self.workers < 1 or self.slots < 1:
            raise ValueError("a cluster needs at least one API node, one worker, one slot")
        self.redis = RedisServer(self.directory)
        common = {**self.settings, "redis_url": self.redis.url}
        if self.sentinel:
            self.group = SentinelGroup(self.directory)
            common.update(redis_sentinels=self.group.addresses, redis_sentinel_master=MASTER)
        for i in range(self.api_nodes):
            self.nodes.append(Node("api", f"api-{i}", {**common}))
        for i in range(self.workers):
            settings = {**common, "slots": self.slots, "worker_name": f"worker-{i}"}
            self.nodes.append(Node("worker", f"worker-{i}", settings))

    @property
    def apis(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "api"]

    @property
    def worker_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "worker"]

    @property
    def urls(self) -> list[str]:
        return [n.process.url for n in self.apis if n.process is not None]

    @property
    def pids(self) -> list[int]:
        """API nodes first, then workers: what ``procwatch.Watcher`` samples."""
        return [n.pid for n in self.nodes if n.process is not None]

    def start(self) -> None:
        if self.group is not None:
            self.group.start()
        else:
            self.redis.start()
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self.start_node, self.nodes))

    def start_node(self, node: Node) -> None:
        """Start (or start again) one node; an API node keeps the port it had."""
        port = "worker_metrics_port" if node.kind == "worker" else "port"
        again = node.process.port if node.process is not None and node.kind == "api" else None
        log = os.path.join(self.directory, f"{node.name}.log")
        node.process = start(log, command=(node.kind,), port_setting=port, port=again,
                             extra_env=self.extra_env, **node.settings)  # fmt: skip
        if node.kind == "worker":
            base = int(node.process.settings["uid_base"])
            node.uids.extend(range(base, base + self.slots))

    def kill(self, node: Node) -> None:
        """SIGKILL the node, as a crash: what it held is left for the others to recover."""
        assert node.process is not None
        if node.process.process.poll() is None:
            node.process.process.send_signal(signal.SIGKILL)
            node.process.process.wait()

    def restart(self, node: Node, down_s: float = 0.0) -> None:
        """Kill the node and, ``down_s`` later, start it again in its place."""
        self.kill(node)
        time.sleep(down_s)
        node.restarts += 1
        self.start_node(node)

    def restart_redis(self, down_s: float = 0.0) -> None:
        """Kill Redis and, ``down_s`` later, start an empty one on the same port (it keeps
        nothing on disk)."""
        self.redis.stop()
        time.sleep(down_s)
        self.redis.start()

    def fail_over(self) -> float:
        """SIGKILL the Redis primary; seconds until the Sentinels promoted its replica. The
        dead one comes back as a replica of the new primary, so it can fail over again."""
        assert self.group is not None, "a Cluster(sentinel=True) fails over"
        old = self.group.primary_port()
        victim = self.group.kill_primary()
        took = self.group.wait_promoted(old)
        self.group.restart_as_replica(victim)
        return took

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.process is not None:
                node.process.stop(timeout_s=30)
        if self.group is not None:
            self.group.stop()
        self.redis.stop()

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
