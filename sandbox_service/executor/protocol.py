"""Frames between a slot (in the service) and its zygote: a JSON header, then raw payload bytes.

A frame is a 4-byte length, a JSON object (the header), then the bytes of its payload fields
(``code``, ``stdin``, ``files`` of a request; ``stdout``, ``stderr`` of a result), whose sizes
the header lists under ``"payload"``. Payload travels outside the JSON so that the zygote never
turns it into Python objects: it receives a request's payload into, and sends a result's from,
one buffer that it wipes after every execution (``payload.py``), since whatever stays in its
heap is copied into the next child by ``fork`` (issue 21, class 5).

The slot side works on asyncio streams (duck-typed, so the zygote never imports asyncio) and
sees payload as ``str``; the zygote side is blocking and sees memoryviews into its buffer. What
travels is typed here: ``ZygoteConfig`` (at start), ``StartReport`` with its
``IsolationReport`` (the zygote's first frame), ``RunSpec`` (one execution) and ``Outcome``
(its result), each generic over the payload's type where it carries payload. Stdlib only, and
nothing the zygote would not import anyway: every module it imports is copied into every child.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Generic, TypeVar

import orjson

MAX_FRAME = 256 * 1024 * 1024
PAYLOAD = ("code", "stdin", "files", "stdout", "stderr", "artifacts")
MAX_ARTIFACTS_BYTES = 16 * 1024 * 1024  # what a run may send back of the files it collects

# A payload field: text on the slot's side, a view into the wiped buffer in the zygote.
P = TypeVar("P", str, memoryview)


class ProtocolError(Exception):
    """The peer sent something that is not a frame, or went away mid-frame."""


def _shallow(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values as they are (``asdict`` would deep-copy payload
    views, which cannot be copied, and would leave a copy of them in the zygote's heap)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _known(cls: Any, message: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in message.items() if k in names}


@dataclass(kw_only=True)
class ZygoteConfig:
    """What a zygote is told at start. Never holds a secret: children inherit its memory.

    The limits have no defaults here: they are ``Settings``' (``pool.zygote_config``)."""

    slot: int
    layers: list[str]  # the isolation layers to try (settings.disable_isolation left out)
    work_root: str
    hide_paths: list[str]
    tmpfs_mb: int
    max_processes: int
    max_open_files: int
    max_file_mb: int
    max_output_bytes: int
    uid: int | None = None
    gid: int | None = None
    preload: list[str] = field(default_factory=list)
    warmup: str = ""
    python_path: list[str] = field(default_factory=list)  # more import directories
    secret_files: list[str] = field(default_factory=list)  # the service's credentials: hidden
    starved_extension: float = 0.0  # settings.starved_extension


class Mode(str, Enum):
    script = "script"
    repl = "repl"  # print the repr of a final expression


class RunStatus(str, Enum):
    """How one execution ended, as its zygote judged it (``judge.py``), or its compile step
    (``compiler.py``): the API's ``Status`` less what only the service decides (killed,
    queue_timeout, rejected)."""

    ok = "ok"
    error = "error"
    compile_error = "compile_error"
    timeout = "timeout"
    memory_limit = "memory_limit"
    output_limit = "output_limit"
    internal_error = "internal_error"


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one execution may use, defined per execution whatever runs in it.

    ``memory_mb`` bounds the execution's processes together (the memory cgroup, or the
    sampler), counted from what the run itself adds: for Python run in the zygote's
    interpreter, on top of that interpreter; for a command exec'd in its place (``argv``), the
    whole of what it maps, since the interpreter it replaced no longer counts.
    ``address_space``: each process also gets ``RLIMIT_AS`` (a backstop where there is no
    cgroup); off for runtimes that reserve far more address space than they use (a JVM)."""

    timeout_s: float
    memory_mb: int
    address_space: bool = True


@dataclass(frozen=True, kw_only=True)
class RunSpec(Generic[P]):
    """One execution: what to run and under which limits, nothing else.

    ``argv`` empty: ``code`` is Python, run in the zygote's interpreter (``child.run``).
    Otherwise ``code`` is written to ``source`` in the working directory, ``files`` beside it
    (those named in ``executables`` made executable), and ``argv`` replaces the interpreter
    (looked up on the child's ``PATH``). ``collect``: patterns (``fnmatch``) of files at the
    top of the working directory sent back with the result, read by the zygote, never
    followed through a link (a compile's output). ``language`` is for reports only: the
    executor knows nothing language-specific."""

    code: P
    limits: Limits
    stdin: P | str = ""
    files: dict[str, str] | memoryview = field(default_factory=dict)  # {path: base64}
    mode: Mode = Mode.script
    language: str = "python"
    argv: list[str] = field(default_factory=list)
    source: str = ""
    executables: list[str] = field(default_factory=list)
    collect: list[str] = field(default_factory=list)

    @property
    def in_process(self) -> bool:
        """Python in the zygote's own interpreter, rather than a command exec'd in its place."""
        return not self.argv

    def frame(self) -> dict[str, Any]:
        return {"op": "run", **_shallow(self), "mode": self.mode.value,
                "limits": _shallow(self.limits)}  # fmt: skip

    @classmethod
    def from_frame(cls, message: dict[str, Any]) -> RunSpec[Any]:
        known = _known(cls, message)
        mode = Mode(known.get("mode", "script"))
        return cls(**{**known, "mode": mode, "limits": Limits(**known["limits"])})


@dataclass(frozen=True, kw_only=True)
class Outcome(Generic[P]):
    """What one execution did, as the zygote observed it (the API's result, less what the
    queue and the worker add)."""

    status: RunStatus
    message: str = ""  # why, for every status but ok and error
    exit_code: int | None = None
    signal: int | None = None
    stdout: P | str = ""
    stderr: P | str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    peak_memory_mb: float = 0.0
    recycle: bool = False  # the zygote could not clean up after it and exits: never reuse it
    # The files RunSpec.collect named, one after the other; their names and sizes in order.
    artifacts: memoryview | bytes = b""
    artifact_index: list[tuple[str, int]] = field(default_factory=list)

    def artifact_files(self) -> dict[str, bytes]:
        """The collected files by name (on the slot's side)."""
        files, at = {}, 0
        for name, size in self.artifact_index:
            files[name] = bytes(self.artifacts[at : at + size])
            at += size
        return files

    def frame(self) -> dict[str, Any]:
        return {**_shallow(self), "status": self.status.value}

    @classmethod
    def from_frame(cls, message: dict[str, Any]) -> Outcome[Any]:
        known = _known(cls, message)
        index = [(str(name), int(size)) for name, size in known.get("artifact_index", [])]
        return cls(**{**known, "status": RunStatus(known["status"]), "artifact_index": index})


@dataclass(frozen=True)
class IsolationReport:
    """Which isolation layers are active (``layers``: name → active) and, for each that is not
    (or is only in part), why (``notes``): reported, never assumed."""

    layers: dict[str, bool]
    notes: dict[str, str] = field(default_factory=dict)

    def active(self, layer: str) -> bool:
        return self.layers.get(layer) is True

    def note(self, layer: str, default: str = "unavailable") -> str:
        return self.notes.get(layer, default)

    def published(self) -> dict[str, bool | str]:
        """The flat shape ``/v1/status`` shows: each layer, and ``<layer>_note`` for a note."""
        flat: dict[str, bool | str] = dict(self.layers)
        flat.update({f"{name}_note": note for name, note in self.notes.items()})
        return flat

    @classmethod
    def from_frame(cls, message: dict[str, Any]) -> IsolationReport:
        return cls(dict(message["layers"]), dict(message.get("notes", {})))


@dataclass(frozen=True, kw_only=True)
class StartReport:
    """A zygote's first frame: it started, with these layers and this much memory."""

    pid: int
    isolation: IsolationReport
    preload_failed: list[str] = field(default_factory=list)  # "module: why", one each
    rss_mb: float = 0.0
    address_space_mb: float = 0.0
    huge_pages_mb: float = 0.0
    cgroup: str | None = None  # its memory cgroup, removed by the slot once it is gone

    def frame(self) -> dict[str, Any]:
        isolation = _shallow(self.isolation)
        return {"op": "ready", **_shallow(self), "isolation": isolation}

    @classmethod
    def from_frame(cls, message: dict[str, Any]) -> StartReport:
        known = _known(cls, message)
        return cls(**{**known, "isolation": IsolationReport.from_frame(known["isolation"])})


@dataclass(frozen=True)
class StartFailure:
    """A zygote's first frame when it cannot start: the step, and the kernel's answer."""

    why: str  # e.g. "subreaper: prctl(PR_SET_CHILD_SUBREAPER): EINVAL (Invalid argument)"

    def frame(self) -> dict[str, Any]:
        return {"op": "failed", "why": self.why}


def _payload_bytes(name: str, value: Any) -> bytes | memoryview:
    if name == "files":
        return orjson.dumps(value)
    if isinstance(value, str):  # lone surrogates survive: the child decodes them back
        return value.encode("utf-8", "surrogatepass")
    return memoryview(value)


def _split(message: dict[str, Any]) -> tuple[bytes, list[bytes | memoryview]]:
    """(length and header, payload buffers) of ``message``."""
    header = {k: v for k, v in message.items() if k not in PAYLOAD}
    parts = [_payload_bytes(k, v) for k, v in message.items() if k in PAYLOAD]
    names = [k for k in message if k in PAYLOAD]
    if names:
        header["payload"] = [[name, len(part)] for name, part in zip(names, parts, strict=True)]
    encoded = orjson.dumps(header)
    return len(encoded).to_bytes(4, "big") + encoded, parts


def encode(message: dict[str, Any]) -> bytes:
    prefix, parts = _split(message)
    return b"".join([prefix, *parts])


def _decode_length(header: bytes) -> int:
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return size


def payload_sizes(header: dict[str, Any]) -> list[tuple[str, int]]:
    sizes = [(str(name), int(size)) for name, size in header.pop("payload", [])]
    if any(size < 0 for _, size in sizes) or sum(s for _, s in sizes) > MAX_FRAME:
        raise ProtocolError(f"payload sizes {sizes} out of range")
    return sizes


def decode_payload(name: str, data: bytes) -> Any:
    """A payload field as the slot side sees it: files a dict, artifacts bytes, the rest text."""
    if name == "files":
        return orjson.loads(data)
    if name in ("stdout", "stderr"):
        return data.decode("utf-8", errors="replace")
    if name == "artifacts":
        return data
    return data.decode("utf-8", "surrogatepass")


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send without joining the payload into one bytes object (no copy of it in this heap)."""
    prefix, parts = _split(message)
    sendall_buffers(sock, [prefix, *parts])


def sendall_buffers(sock: socket.socket, buffers: Sequence[bytes | memoryview]) -> None:
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:64])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    if not recv_into_exactly(sock, memoryview(buf)):
        return None
    return bytes(buf)


def recv_into_exactly(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False if the peer closed before sending anything."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and len(view):
                return False
            raise ProtocolError("peer closed the connection mid-frame")
        got += n
    return True


def recv_header(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame's header (its payload still to be read), or None on a clean close."""
    length = _recv_exactly(sock, 4)
    if length is None:
        return None
    header = _recv_exactly(sock, _decode_length(length))
    if header is None:
        raise ProtocolError("peer closed the connection mid-frame")
    message: dict[str, Any] = orjson.loads(header)
    return message


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, payload decoded, or None when the peer closed the connection
    cleanly. (The zygote reads payload into its own buffer instead: ``payload.receive``.)"""
    message = recv_header(sock)
    if message is None:
        return None
    for name, size in payload_sizes(message):
        data = _recv_exactly(sock, size) if size else b""
        if data is None:
            raise ProtocolError("peer closed the connection mid-frame")
        message[name] = decode_payload(name, data)
    return message


async def read_message(reader: Any) -> dict[str, Any]:
    """Read one message from an asyncio StreamReader; IncompleteReadError on EOF."""
    header = await reader.readexactly(4)
    message: dict[str, Any] = orjson.loads(await reader.readexactly(_decode_length(header)))
    for name, size in payload_sizes(message):
        message[name] = decode_payload(name, await reader.readexactly(size))
    return message
