"""A Redis primary, its replica and three Sentinels on loopback free ports: the failover
shape of Redis mode, for tests and ``loadtests.faults``.

Debian's ``redis-server`` and ``redis-sentinel`` (package ``redis-sentinel``); no persistence,
so what a failover loses is exactly what the replica had not received. The Sentinels notice a
silent primary after ``DOWN_AFTER_MS`` and promote the replica; ``kill_primary`` plays the
crash, ``restart_as_replica`` brings the dead one back behind the new primary (never as an
empty primary), so the group can fail over again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

import redis

from sandbox_service.service_process import LaunchError, RedisServer, free_port

MASTER = "sandbox"
DOWN_AFTER_MS = 1000  # a primary silent this long is down (Sentinel's own floor is ~1 s)
FAILOVER_TIMEOUT_MS = 2000  # and twice this between two failovers of the group
QUORUM = 2
FAST_SYNC = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


def available() -> bool:
    """Are Debian's ``redis-server`` and ``redis-sentinel`` both installed?"""
    return shutil.which("redis-server") is not None and shutil.which("redis-sentinel") is not None


def pause(process: subprocess.Popen[bytes], seconds: float) -> None:
    """SIGSTOP a process for ``seconds``, then SIGCONT: to the others, it fell silent."""
    process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        process.send_signal(signal.SIGCONT)


class SentinelGroup:
    """Two ``redis-server`` (a primary and a replica) and three ``redis-sentinel``."""

    def __init__(self, directory: str, args: tuple[str, ...] = ()) -> None:
        """``args``: more options for both servers (``--appendonly yes``, ...)."""
        self.directory = directory
        self.args = (*FAST_SYNC, *args)
        self.servers: list[RedisServer] = []
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def addresses(self) -> str:
        """The ``redis_sentinels`` setting that names them."""
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    def _server(self, name: str, replica_of: int | None) -> RedisServer:
        directory = os.path.join(self.directory, name)
        os.makedirs(directory, exist_ok=True)
        extra = ("--replicaof", "127.0.0.1", str(replica_of)) if replica_of else ()
        return RedisServer(directory, [*self.args, *extra])

    def start(self, timeout_s: float = 30.0) -> None:
        primary = self._server("a", None)
        primary.start()
        replica = self._server("b", primary.port)
        replica.start()
        self.servers = [primary, replica]
        self._wait(lambda: self._linked(replica.port), timeout_s, "the replica to sync")
        for n, port in enumerate(self.sentinel_ports):
            self.sentinels.append(self._sentinel(n, port, primary.port))
        self._wait(self._watching, timeout_s, "the Sentinels to see each other and the replica")

    def _sentinel(self, n: int, port: int, primary: int) -> subprocess.Popen[bytes]:
        config = os.path.join(self.directory, f"sentinel-{n}.conf")
        with open(config, "w") as f:  # Sentinel rewrites its file: one of its own each
            f.write(
                f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} {QUORUM}\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
        with open(os.path.join(self.directory, f"sentinel-{n}.log"), "ab") as log:
            return subprocess.Popen(["redis-sentinel", config], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip

    @staticmethod
    def _client(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)

    def _replication(self, port: int) -> dict[str, object]:
        with self._client(port) as client:
            return client.info("replication")  # type: ignore[no-any-return]

    def _linked(self, port: int) -> bool:
        return self._replication(port).get("master_link_status") == "up"

    def _watching(self) -> bool:
        for port in self.sentinel_ports:
            with self._client(port) as client:
                state = client.sentinel_master(MASTER)
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                return False
        return True

    @staticmethod
    def _wait(check: object, timeout_s: float, what: str) -> float:
        began = time.monotonic()
        while time.monotonic() < began + timeout_s:
            with contextlib.suppress(redis.RedisError, OSError):
                if check():  # type: ignore[operator]
                    return time.monotonic() - began
            time.sleep(0.05)
        raise LaunchError(f"timed out waiting for {what}")

    def primary_port(self) -> int:
        """The primary's port, as the Sentinels say."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError, OSError), self._client(port) as client:
                address = client.sentinel_get_master_addr_by_name(MASTER)
                if address:
                    return int(address[1])
        raise LaunchError("no Sentinel answers")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> RedisServer:
        return self.server(self.primary_port())

    def kill_primary(self) -> RedisServer:
        """SIGKILL the primary (a crash: what it had not replicated is gone)."""
        victim = self.primary()
        victim.stop()
        return victim

    def wait_promoted(self, old: int, timeout_s: float = 30.0) -> float:
        """Seconds until the Sentinels name a primary other than ``old`` and it takes writes."""
        return self._wait(
            lambda: (port := self.primary_port()) != old and self._writable(port),
            timeout_s,
            "the Sentinels to promote the replica",
        )

    def _writable(self, port: int) -> bool:
        return self._replication(port).get("role") == "master"

    def restart_as_replica(self, server: RedisServer, timeout_s: float = 30.0) -> None:
        """Start a dead server again on its port, as a replica of the current primary."""
        primary = self.primary_port()
        server.args = [*self.args, "--replicaof", "127.0.0.1", str(primary)]
        server.start()
        self._wait(lambda: self._linked(server.port), timeout_s, "the old primary to resync")

    def cut_replicas(self) -> None:
        """Drop the primary's links to its replicas: writes from now on stay in its backlog
        until a replica reconnects (stop it first, and they never get there)."""
        with self._client(self.primary_port()) as client:
            client.client_kill_filter(_type="replica")

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.sentinels = []
        for server in self.servers:
            server.stop()

    def __enter__(self) -> SentinelGroup:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
