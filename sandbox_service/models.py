"""The native API contract: requests, results and status reports, as pydantic models.

These types are the edge of the service. The API validates requests against them (shape and
sanity here, server maxima in ``api.policy``), the client returns them, and the queue carries
them between nodes. Field names and defaults follow ``DESIGN.md`` exactly; other code, the
load tests and CI rely on them.
"""

from __future__ import annotations

import base64
import binascii
import enum
import posixpath
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from sandbox_service.executor import languages
from sandbox_service.executor.protocol import Mode as Mode

# For the published schema: what the validators below accept, as JSON Schema can say it.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
RELATIVE_PATH_PATTERN = r"^(?!/)(?!(?:.*/)?\.\.(?:/|$))(?!\.?/*$)[^\x00]+$"


def _json_number(value: object) -> object:
    # Lax pydantic would turn "10" and true into numbers; the published schema (and JSON
    # Schema's idea of an integer, which takes 10.0) says a number. Strict mode is no better:
    # it refuses 10.0 for an integer.
    if isinstance(value, (str, bool)):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_number)]
JsonFloat = Annotated[float, BeforeValidator(_json_number)]


class Status(str, enum.Enum):
    """How an execution ended. The first seven are the program's doing; the rest the service's.

    - ``ok``: exited with status 0.
    - ``error``: exited non-zero (an uncaught exception, ``sys.exit(3)``) or died of a signal
      it raised itself (a segfault in native code, ``os.abort()``).
    - ``compile_error``: a compiled language's compile failed (errors, or past the compile's
      own limits); it never ran. The compiler's output is in ``compile``.
    - ``timeout``: ran past its wall-clock or CPU limit and was killed.
    - ``memory_limit``: ran out of its address-space limit (``MemoryError``).
    - ``output_limit``: wrote more than the server's output cap and was killed.
    - ``killed``: ended by SIGKILL that no limit of ours sent (for example the kernel, or the
      service stopping before it finished).
    - ``queue_timeout``: its deadline passed before it could start; it never ran.
    - ``rejected``: the service refused to run it (shutting down), or Redis lost it (a failover,
      a Redis restarted empty); no result will come for it, and sending it again is safe.
    - ``internal_error``: the sandbox itself failed. Never the program's fault.
    """

    ok = "ok"
    error = "error"
    compile_error = "compile_error"
    timeout = "timeout"
    memory_limit = "memory_limit"
    output_limit = "output_limit"
    killed = "killed"
    queue_timeout = "queue_timeout"
    rejected = "rejected"
    internal_error = "internal_error"


# Mode is the executor's (one definition); Status is RunStatus and what only the service
# decides, kept equal by tests/sandbox_service/test_contract.py.
SERVICE_ONLY = ("killed", "queue_timeout", "rejected")


def check_relative_path(path: str) -> str:
    """A ``files`` key must stay inside the working directory once joined to it."""
    if not path or "\x00" in path:
        raise ValueError("file path must be a non-empty string without NUL bytes")
    if path.startswith("/"):
        raise ValueError(
            f"file path {path!r} is absolute; give a path relative to the working directory"
        )
    if ".." in path.split("/"):
        raise ValueError(f"file path {path!r} leaves the working directory ('..')")
    norm = posixpath.normpath(path)
    if norm == ".":
        raise ValueError(f"file path {path!r} names the working directory itself, not a file")
    return norm


def _directories_of(norm: str) -> list[str]:
    """The directories a normalised path needs: ``a`` and ``a/b`` for ``a/b/c``."""
    parts = norm.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def files_conflict(paths: Iterable[str]) -> str | None:
    """Why ``files`` keys cannot all be written (two name the same file, or one is a file where
    another needs a directory: ``a`` and ``a/b``), or None. The caller's fault: a 422."""
    seen: dict[str, str] = {}
    for path in paths:
        norm = check_relative_path(path)
        if norm in seen:
            return f"file paths {seen[norm]!r} and {path!r} name the same file"
        seen[norm] = path
    for norm, path in seen.items():
        for directory in _directories_of(norm):
            if directory in seen:
                return (f"file path {seen[directory]!r} is a file, but {path!r} needs it to be "
                        "a directory")  # fmt: skip
    return None


def merge_files(earlier: dict[str, str], later: dict[str, str]) -> dict[str, str]:
    """``later`` written over ``earlier`` (a session's files, then a cell's): an earlier file
    in the way of a later one, or under a later file's name, is dropped, as writing the later
    tree over the earlier one would do. ``later`` is a request's files, already without
    conflicts of its own (``files_conflict``): linear in both, where asking ``files_conflict``
    per earlier file was their product, on the event loop."""
    names = {check_relative_path(p) for p in later}
    needed = {d for n in names for d in _directories_of(n)}
    merged = dict(later)
    for path, data in earlier.items():
        norm = check_relative_path(path)
        if norm in names or norm in needed or any(d in names for d in _directories_of(norm)):
            continue
        merged[path] = data
    return merged


class ExecuteRequest(BaseModel):
    """One program to run. Server maxima (timeout, memory, code size) are checked by the API."""

    model_config = ConfigDict(
        extra="forbid",
        use_enum_values=False,
        # What _python_only refuses, said in the published schema: a client (or a fuzzer)
        # following the document is never refused a request the schema allows.
        json_schema_extra={"allOf": [{
            "if": {"properties": {"language": {"not": {"enum": list(languages.PYTHON_NAMES)}}},
                   "required": ["language"]},
            "then": {"properties": {"session_id": {"type": "null"}, "mode": {"const": "script"}}},
        }]},
    )  # fmt: skip

    code: str = Field(description="The program's source.")
    stdin: str = Field(default="", description="Standard input given to the program.")
    language: str = Field(
        default="python",
        description="The program's language (GET /v1/status lists the toolchains of this "
        "node). Python runs in the preloaded interpreter; cpp and java are compiled first (once "
        "per program: a compile cache), nodejs runs with node. Aliases: c++, javascript, js.",
        json_schema_extra={"enum": list(languages.ALL_NAMES)},
    )
    timeout_s: JsonFloat = Field(default=10.0, gt=0, description="Wall-clock limit in seconds.")
    memory_mb: JsonInt = Field(default=1024, gt=0, description="Address-space limit in MiB.")
    mode: Mode = Field(
        default=Mode.script,
        description="'repl' prints the repr of a final expression, as IPython does.",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Files written into the working directory first: relative path -> base64.",
        json_schema_extra={
            "propertyNames": {"pattern": RELATIVE_PATH_PATTERN},
            "additionalProperties": {"type": "string", "pattern": BASE64_PATTERN},
        },
    )
    id: str | None = Field(
        default=None,
        max_length=256,
        description="Idempotency key: a request with an id seen before returns the stored result.",
    )
    session_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Keep Python state across calls: the session's earlier successful cells are "
        "replayed (silently) before this one. A cell that does not end ok leaves no trace.",
    )

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        return languages.lookup(value).name  # UnknownLanguage is a ValueError: a 422

    @model_validator(mode="after")
    def _python_only(self) -> ExecuteRequest:
        """Sessions and repl mode are Python's: its state, its expressions."""
        if self.language != "python":
            if self.session_id is not None:
                raise ValueError(f"session_id is for python only, not {self.language}")
            if self.mode is not Mode.script:
                raise ValueError(f"mode 'repl' is for python only, not {self.language}")
        return self

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for path, data in value.items():
            check_relative_path(path)
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"file {path!r}: content is not valid base64 ({exc})") from None
        why = files_conflict(value)
        if why is not None:
            raise ValueError(why)
        return value


class CompileResult(BaseModel):
    """The compile step of a compiled language: how the compiler ended, what it printed."""

    status: Status = Field(description="ok, or how the compile failed (error, timeout, ...).")
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = Field(default="", description="The compiler's diagnostics.")
    wall_time_s: float = 0.0
    cached: bool = Field(
        default=False, description="This node had compiled the same program (compile cache)."
    )
    message: str = ""


class ExecuteResult(BaseModel):
    """What happened to one request. ``message`` says why for every status but ok and error."""

    id: str | None = None
    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    peak_memory_mb: float = 0.0
    queue_time_s: float = 0.0
    worker: str = ""
    message: str = ""
    compile: CompileResult | None = Field(
        default=None, description="The compile step, for a compiled language (cpp, java)."
    )


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[ExecuteRequest], Field(min_length=1)]


class BatchResponse(BaseModel):
    results: list[ExecuteResult]


class ErrorDetail(BaseModel):
    """One problem with a request, shaped like FastAPI's own validation errors."""

    loc: list[str | int]
    msg: str
    type: str
    ctx: dict[str, object] | None = None


class ErrorBody(BaseModel):
    detail: list[ErrorDetail] | str


class RequestRejected(Exception):
    """The request breaks the contract or a server limit: 413 or 422 with the reasons."""

    def __init__(self, status_code: int, details: list[ErrorDetail]) -> None:
        self.status_code = status_code
        self.details = details
        super().__init__("; ".join(f"{'.'.join(map(str, d.loc))}: {d.msg}" for d in details))


class SlotState(BaseModel):
    index: int
    pid: int | None
    busy: bool
    executions: int
    restarts: int
    uid: int | None
    healthy: bool = Field(description="Running, and its last canary execution passed.")
    canaries: int = Field(description="Canary executions run (at start, restarts, periodically).")
    failures: int = Field(description="Consecutive failed starts or canaries (0 once healthy).")
    last_error: str | None = Field(
        default=None, description="Why its last start or canary failed, while it has not passed."
    )


class WorkerInfo(BaseModel):
    name: str
    slots: int
    busy: int
    executions: int
    healthy_slots: int = Field(description="Slots that passed their last canary and run.")
    cores: int = Field(default=0, description="Executions that start at full speed at once.")
    stragglers: int = Field(
        default=0, description="Executions past straggler_after_s, their core given back."
    )
    last_seen_s: float = 0.0


class StatusReport(BaseModel):
    """``GET /v1/status``: what an operator or an autoscaler needs to know."""

    mode: Literal["embedded", "redis"]
    queue_depth: int
    in_flight: int
    workers: list[WorkerInfo]
    slots: list[SlotState] = Field(default_factory=list)
    light_slots: list[SlotState] = Field(
        default_factory=list,
        description="Each slot's light zygote (standard-library preloads only), if it has one.",
    )
    isolation: dict[str, bool | str] = Field(default_factory=dict)
    languages: dict[str, str] = Field(
        default_factory=dict,
        description="Each language: its toolchain's version here, or 'unavailable: why'.",
    )
    zygote: dict[str, object] = Field(
        default_factory=dict, description="Preloaded interpreter: resident MiB, failed preloads."
    )
    executions: dict[str, int] = Field(default_factory=dict)
    reclaimed: int = 0
    dropped: dict[str, int] = Field(
        default_factory=dict,
        description="Jobs dropped because their client went away: queued (never ran), running "
        "(killed); on this node.",
    )
    limits: dict[str, float | int] = Field(
        default_factory=dict, description="Server maxima: max_batch, max_timeout_s, ..."
    )
    uptime_s: float = 0.0
