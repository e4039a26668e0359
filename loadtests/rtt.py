"""Redis mode as if across hosts: every link held for a round-trip time, throughput and latency.

    python -m loadtests.rtt --rtt-ms 0,0.5,2,10 --count 3000

For each RTT a fresh ``Cluster`` (a throwaway Redis, ``--api-nodes`` API nodes, ``--workers``
worker nodes) in which each node reaches Redis through a proxy of its own, and the client
reaches each API node through one, that holds every chunk of bytes RTT/2 in each direction
(``DelayLinks``, in a process of its own). Measured per RTT: lone requests (one in flight:
p50/p99), single requests at ``--concurrency`` in flight, and batches of ``--batch``; for
each, exec/s and the Redis round trips per execution (the chunks the nodes sent Redis, a
pipeline being one: background sweeps and heartbeats included). RTT ``direct`` is the same
cluster without proxies.

What it is not: a network. The delay is per chunk read off a socket, not per frame: no loss,
no bandwidth limit, no interplay of Nagle's algorithm with delayed ACKs. The proxies run in
one process on the same 2 cores as everything else, so their own cost rises with load; read
a row beside the ``0`` row (proxies, no delay), not beside ``direct``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import queue
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from loadtests.cluster import Cluster
from loadtests.generator import Plan, Run, measure
from loadtests.report import percentile
from loadtests.targets import HttpTarget
from loadtests.workloads import Context, parse

ONE_WAY_CHUNK = 1 << 16


@dataclass(frozen=True)
class Link:
    """A proxy: ``listen`` accepts and forwards each connection to ``to``; ``counted`` links
    count the chunks sent toward ``to`` (the round trips asked of it)."""

    name: str
    to: tuple[str, int]
    counted: bool


def _forward(src: socket.socket, dst: socket.socket, delay_s: float, count: list[int]) -> None:
    """One direction of one connection: a reader stamps each chunk, a writer sends it once
    ``delay_s`` has passed since it was read (two threads, so a chunk read while another
    waits is stamped when it came, not when the writer got to it)."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def write() -> None:
        while True:
            due, data = held.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    while True:
        try:
            data = src.recv(ONE_WAY_CHUNK)
        except OSError:
            data = b""
        held.put((time.monotonic() + delay_s, data))
        if not data:
            break
        count[0] += 1
    writer.join()


def _serve(link: Link, listener: socket.socket, delay_s: float, count: list[int]) -> None:
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(link.to)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sent_to = count if link.counted else [0]
        threading.Thread(target=_forward, args=(client, server, delay_s, sent_to),
                         daemon=True).start()  # fmt: skip
        threading.Thread(target=_forward, args=(server, client, delay_s, [0]),
                         daemon=True).start()  # fmt: skip


def _proxies(links: list[Link], delay_s: float, control: multiprocessing.connection.Connection,
             ) -> None:  # fmt: skip
    """The proxy process: answers its ports, then each link's counted chunks when asked."""
    sys.setswitchinterval(1e-4)  # a writer due now must not wait 5 ms for a busy reader
    counts = [[0] for _ in links]
    ports = []
    for link, count in zip(links, counts, strict=True):
        listener = socket.create_server(("127.0.0.1", 0))
        ports.append(listener.getsockname()[1])
        threading.Thread(target=_serve, args=(link, listener, delay_s, count), daemon=True).start()
    control.send(ports)
    while control.recv() == "count":
        control.send([count[0] for count in counts])


class DelayLinks:
    """The proxies of one RTT, in a process of their own (the client's event loop and the
    proxies' threads would otherwise share one interpreter lock)."""

    def __init__(self, links: list[Link], rtt_ms: float) -> None:
        context = multiprocessing.get_context("spawn")
        self.control, child = context.Pipe()
        self.process = context.Process(target=_proxies, args=(links, rtt_ms / 2000, child),
                                       daemon=True)  # fmt: skip
        self.process.start()
        self.ports: list[int] = self.control.recv()

    def sent(self) -> list[int]:
        """Chunks sent through each counted link so far."""
        self.control.send("count")
        return list(self.control.recv())

    def stop(self) -> None:
        self.control.send("stop")
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


@dataclass
class Row:
    rtt: str
    shape: str
    answered: int
    exec_per_s: float
    p50_ms: float
    p99_ms: float
    api_trips: float | None  # Redis round trips per execution asked by the API nodes
    worker_trips: float | None  # and by the workers


def row(rtt: str, shape: str, run: Run, chunks: tuple[int, int] | None) -> Row:
    """``chunks``: sent to Redis by the API nodes and by the workers during the run."""
    latencies = sorted(run.recorder.latency)
    answered = run.recorder.answered
    return Row(
        rtt, shape, answered, answered / run.seconds if run.seconds else 0.0,
        1000 * (percentile(latencies, 0.5) or 0.0), 1000 * (percentile(latencies, 0.99) or 0.0),
        *((c / answered for c in chunks) if chunks is not None and answered else (None, None)),
    )  # fmt: skip


async def one_rtt(args: argparse.Namespace, rtt: str) -> list[Row]:
    """Start a cluster behind proxies of this RTT (none for ``direct``) and measure it."""
    with tempfile.TemporaryDirectory(prefix="rtt-") as scratch:
        cluster = Cluster(scratch, args.api_nodes, args.workers, args.slots)
        links: DelayLinks | None = None
        if rtt != "direct":
            redis = ("127.0.0.1", cluster.redis.port)
            links = DelayLinks([Link(n.name, redis, True) for n in cluster.nodes], float(rtt))
            for node, port in zip(cluster.nodes, links.ports, strict=True):
                node.settings["redis_url"] = f"redis://127.0.0.1:{port}/0"
        try:
            with cluster:
                urls = cluster.urls
                if links is not None:  # the client's links to the API nodes, same delay
                    api = DelayLinks([Link(f"to-{u}", _address(u), False) for u in urls],
                                     float(rtt))  # fmt: skip
                    urls = [f"http://127.0.0.1:{p}" for p in api.ports]
                try:
                    return await _measure(args, rtt, ",".join(urls), links)
                finally:
                    if links is not None:
                        api.stop()
        finally:
            if links is not None:
                links.stop()


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def _measure(args: argparse.Namespace, rtt: str, url: str, links: DelayLinks | None,
                   ) -> list[Row]:  # fmt: skip
    workload = parse(args.workload)
    target = HttpTarget(url, "service", timeout_s=120)
    port = _address(url.split(",")[0])[1]
    shapes = [("lone", 1, 1, args.lone), ("singles", args.concurrency, 1, args.count),
              ("batches", args.concurrency, args.batch, args.count)]  # fmt: skip
    await measure(target, workload.items(64, args.seed + 1, Context(port)), Plan(64, 16, 4),
                  workload=workload.name, target_name=url, progress=False)  # fmt: skip
    rows = []
    for shape, concurrency, batch, count in shapes:
        before = links.sent() if links else []
        plan = Plan(count, concurrency, batch, args.duration, 60)
        run = await measure(target, workload.items(count, args.seed, Context(port)), plan,
                            workload=workload.name, target_name=url, progress=False)  # fmt: skip
        chunks = None
        if links is not None:  # the links are the cluster's nodes, API nodes first
            added = [b - a for a, b in zip(before, links.sent(), strict=True)]
            chunks = sum(added[: args.api_nodes]), sum(added[args.api_nodes :])
        rows.append(row(rtt, shape, run, chunks))
        print(_line(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _line(r: Row) -> str:
    trips = "–"
    if r.api_trips is not None and r.worker_trips is not None:
        trips = f"{r.api_trips + r.worker_trips:.2f} ({r.api_trips:.2f} + {r.worker_trips:.2f})"
    return (f"| {r.rtt} | {r.shape} | {r.answered} | {r.exec_per_s:,.0f} | "
            f"{r.p50_ms:.1f} / {r.p99_ms:.1f} | {trips} |")  # fmt: skip


def table(rows: list[Row]) -> str:
    lines = ["| RTT ms | shape | answered | exec/s | latency p50 / p99 ms | Redis round trips "
             "per execution (API + workers) |", "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [_line(r) for r in rows]
    at_0 = {r.shape: r for r in rows if r.rtt == "0"}
    for r in rows:
        if r.rtt in ("0", "direct") or r.shape not in at_0 or not float(r.rtt):
            continue
        if r.shape == "lone":  # what the delay added to the median, in round trips
            trips = (r.p50_ms - at_0["lone"].p50_ms) / float(r.rtt)
            lines.append(f"lone at {r.rtt} ms: {trips:.1f} RTTs on the path (client→API is 1)")
        elif at_0[r.shape].exec_per_s:
            ratio = r.exec_per_s / at_0[r.shape].exec_per_s
            lines.append(f"{r.shape} at {r.rtt} ms: {ratio:.2f} of 0 ms's exec/s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.rtt", description=__doc__.split("\n")[0])
    p.add_argument("--rtt-ms", default="direct,0,0.5,2,10",
                   help="round-trip times in ms, comma-separated; 'direct': no proxy")  # fmt: skip
    p.add_argument("--api-nodes", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2, help="slots per worker node")
    p.add_argument("--workload", default="trivial")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--count", type=int, default=3000, help="executions per shape")
    p.add_argument("--lone", type=int, default=200, help="lone requests per RTT")
    p.add_argument("--duration", type=float, default=300, help="at most this long per shape")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.rtts = [r.strip() for r in args.rtt_ms.split(",") if r.strip()]
    for r in args.rtts:
        if r != "direct":
            try:
                if float(r) < 0:
                    raise ValueError
            except ValueError:
                p.error(f"--rtt-ms: {r!r} is neither 'direct' nor a non-negative number")
    if min(args.api_nodes, args.workers, args.slots, args.concurrency, args.batch) < 1:
        p.error("--api-nodes, --workers, --slots, --concurrency and --batch must be >= 1")
    if min(args.count, args.lone) < 1:
        p.error("--count and --lone must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows: list[Row] = []
    for rtt in args.rtts:
        rows += asyncio.run(one_rtt(args, rtt))
    print(table(rows))


if __name__ == "__main__":
    main()
