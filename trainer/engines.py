"""One scheduler over every rank's engine: the colocated layout's turns placed across all GPUs.

Colocated, every trainer rank hosts one engine. With ``rollout.engines: own`` each rank's
scheduler places its own share of the groups on its own engine, so a rank whose rollouts run
long cannot hand turns to an idle neighbour. With ``shared`` (:class:`EngineGroup`), rank 0's
scheduler places every turn of the step on any rank's engine, as the report's rollout
scheduler does: for the step's rollouts every other rank serves its engine on a socket
(:class:`EngineServer`), rank 0 holds a :class:`RemoteEngine` for each, the addresses go round
by ``DataParallel.all_gather``, and the groups by ``broadcast`` when rank 0 is done.

The wire: length-prefixed pickles over TCP between the ranks of one job (one trust domain, as
the engine's own processes). Rank 0 says ``hello`` (the served engine's KV cache comes back),
then ``generate`` requests (any number in flight, answered as they finish), then ``end``.
A remote engine counts what its own requests in flight may take against the capacity the
server reported, as the vLLM backend counts its own (``VLLMBackend.kv_capacity``): nothing
else generates on a served engine during the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pickle
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import torch

from trainer.backends.base import Generation, GenerationBackend, GenerationRequest, SamplingParams
from trainer.parallel import SINGLE, DataParallel
from trainer.placement import KvCapacity, ReportsKvCapacity

T = TypeVar("T")
_HEADER = struct.Struct("!I")


async def send(writer: asyncio.StreamWriter, message: object) -> None:
    """One message: its pickle, after its length."""
    body = pickle.dumps(message)
    writer.write(_HEADER.pack(len(body)) + body)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message, or None at the end of the stream."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        return pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return None


class EngineServer:
    """Serves ``backend`` to one client until it says ``end`` (or goes away)."""

    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend
        self.served = 0  # generations answered
        self.done: asyncio.Future[None] | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str = "127.0.0.1") -> tuple[str, int]:
        """Listen on a free port of ``host``; the address to connect to."""
        self.done = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_server(self._client, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return host, port

    async def finished(self) -> None:
        """Wait for the client's ``end``, then stop listening."""
        assert self.done is not None and self._server is not None
        try:
            await self.done
        finally:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lock = asyncio.Lock()  # one message on the wire at a time
        try:
            while (message := await receive(reader)) is not None:
                kind, *args = message
                if kind == "end":
                    break
                if kind == "hello":
                    await send(writer, ("hello", self._capacity()))
                elif kind == "generate":
                    task = asyncio.create_task(self._generate(writer, lock, *args))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            await asyncio.gather(*self._tasks)
        finally:
            writer.close()
            assert self.done is not None
            if not self.done.done():
                self.done.set_result(None)

    def _capacity(self) -> tuple[bool, KvCapacity | None]:
        capacity = (
            self.backend.kv_capacity() if isinstance(self.backend, ReportsKvCapacity) else None
        )
        return self.backend.continuous_batching, capacity

    async def _generate(
        self,
        writer: asyncio.StreamWriter,
        lock: asyncio.Lock,
        number: int,
        requests: list[GenerationRequest],
        params: SamplingParams,
    ) -> None:
        try:
            answer: tuple[str, int, object] = (
                "done",
                number,
                await self.backend.generate(requests, params),
            )
        except Exception as exc:  # the client raises it where the generation was awaited
            answer = ("error", number, f"{type(exc).__name__}: {exc}")
        self.served += len(requests)
        async with lock:
            await send(writer, answer)


class RemoteEngineError(RuntimeError):
    """A served engine failed a generation; the message is the server's."""


class RemoteEngine(GenerationBackend):
    """A served engine, as rank 0's scheduler sees it. Build with :func:`connect`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        continuous_batching: bool,
        capacity: KvCapacity | None,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.continuous_batching = continuous_batching
        self.capacity = capacity
        self.held_blocks = 0  # what this client's requests in flight may take
        self._numbers = itertools.count()
        self._waiting: dict[int, asyncio.Future[list[Generation]]] = {}
        self._reading = asyncio.create_task(self._read())

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        number = next(self._numbers)
        future = asyncio.get_running_loop().create_future()
        self._waiting[number] = future
        blocks = sum(self._blocks(r) for r in requests)
        self.held_blocks += blocks
        try:
            await send(self.writer, ("generate", number, list(requests), params))
            return await future
        finally:
            self.held_blocks -= blocks
            self._waiting.pop(number, None)

    def _blocks(self, request: GenerationRequest) -> int:
        if self.capacity is None:
            return 0
        return self.capacity.blocks_for(len(request.prompt_ids) + request.max_new_tokens)

    async def _read(self) -> None:
        while (message := await receive(self.reader)) is not None:
            kind, number, body = message
            future = self._waiting.get(number)
            if future is None or future.done():
                continue
            if kind == "done":
                future.set_result(body)
            else:
                future.set_exception(RemoteEngineError(body))
        for future in self._waiting.values():  # the server went away
            if not future.done():
                future.set_exception(RemoteEngineError("the engine's server closed"))

    async def end(self) -> None:
        """Tell the server the step is over; it answers what is in flight, then stops."""
        with contextlib.suppress(ConnectionError):
            await send(self.writer, ("end",))
        await self._reading
        self.writer.close()


class RemoteKvEngine(RemoteEngine):
    """A served engine that reports its KV cache: the server's, less what is held here."""

    def kv_capacity(self) -> KvCapacity:
        assert self.capacity is not None
        c = self.capacity
        return KvCapacity(
            c.block_size, c.total_blocks, max(0, c.free_blocks - self.held_blocks), c.max_seqs
        )


async def connect(host: str, port: int) -> RemoteEngine:
    """A client of the engine served at ``host:port``."""
    reader, writer = await asyncio.open_connection(host, port)
    await send(writer, ("hello",))
    reply = await receive(reader)
    if reply is None:
        raise RemoteEngineError(f"{host}:{port} closed before saying hello")
    _, (continuous, capacity) = reply
    kind = RemoteEngine if capacity is None else RemoteKvEngine
    return kind(reader, writer, continuous, capacity)


class EngineGroup(GenerationBackend):
    """Every rank's engine under rank 0's scheduler (module docstring). On its own it is this
    rank's engine: ``generate`` and the phase hooks go to it."""

    def __init__(self, local: GenerationBackend, dp: DataParallel = SINGLE) -> None:
        self.local, self.dp = local, dp
        self.continuous_batching = local.continuous_batching
        self.per_rank = local.per_rank

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        return await self.local.generate(requests, params)

    def offload(self) -> None:
        self.local.offload()

    def close(self) -> None:
        self.local.close()

    def update_weights(self, model: torch.nn.Module, changed: bool = True) -> None:
        self.local.update_weights(model, changed)

    async def run(
        self, work: Callable[[list[GenerationBackend]], Awaitable[T]], host: str | None = None
    ) -> T | None:
        """``work(engines)`` on rank 0 with every rank's engine (its own first), while the
        other ranks serve theirs on ``host`` (default: :func:`reachable_host`); rank 0's
        result, None elsewhere. Every rank calls it."""
        if not self.dp.distributed:
            return await work([self.local])
        server = None if self.dp.rank == 0 else EngineServer(self.local)
        address = await server.start(host or reachable_host()) if server is not None else None
        addresses = self.dp.all_gather(address)
        if server is not None:
            await server.finished()
            return None
        async with _remotes([a for a in addresses if a is not None]) as remotes:
            return await work([self.local, *remotes])


def reachable_host() -> str:
    """This node's address as rank 0 reaches it: the interface that routes to torchrun's
    ``MASTER_ADDR`` (rank 0's node; a UDP socket's connect sends nothing), 127.0.0.1 alone."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master, 9))
        except OSError:
            return "127.0.0.1"
        return str(probe.getsockname()[0])


@contextlib.asynccontextmanager
async def _remotes(addresses: Sequence[tuple[str, int]]) -> AsyncIterator[list[RemoteEngine]]:
    remotes: list[RemoteEngine] = []
    try:
        for host, port in addresses:
            remotes.append(await connect(host, port))
        yield remotes
    finally:
        for remote in remotes:
            await remote.end()
