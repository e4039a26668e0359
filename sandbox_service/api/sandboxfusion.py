"""SandboxFusion's API: ``POST /run_code``, ``POST /run_jupyter``, ``GET /v1/ping``.

What verl's sandbox tool and reward, SkyRL, ROLL and ToRL (and the ``sandbox-fusion`` client
package) send. Shapes follow bytedance/SandboxFusion ``sandbox/server/sandbox_api.py`` and
``sandbox/runners/types.py`` (RunCodeRequest with ``memory_limit_MB``, RunCodeResponse,
CommandRunResult, RunJupyterRequest/Response, CellRunResult) and its ``parse_run_status``:

- ``run_result.status`` is ``Finished`` whenever the program ran to its end, whatever its
  exit code; ``TimeLimitExceeded`` (``return_code`` null) when it was stopped for time;
  ``Error`` when the sandbox could not run it. See ``compat.OUTCOMES`` for every status.
- ``status`` is ``Success`` (finished with 0), ``Failed`` (non-zero or time limit) or
  ``SandboxError`` (with ``message``); the client package raises on ``SandboxError``.
  A run stopped by a limit (output, memory, killed) is ``Failed`` with the limit in
  ``message`` and ``return_code`` null unless it has a non-zero one: the program may have
  exited 0 between passing the output cap and being stopped, and is still not a success.
- Languages: ``python``, ``cpp``, ``java``, ``nodejs`` (SandboxFusion's names; ``javascript``
  is read as ``nodejs``), from the service's table (``executor.languages``). A compiled
  language reports its compile step in ``compile_result`` as SandboxFusion does: ``Finished``
  with the compiler's exit status (non-zero: a compile error, overall ``Failed`` with
  ``run_result`` null, which verl scores -4), or ``TimeLimitExceeded`` past the compile's own
  limit. Python and Node.js have no compile step: ``compile_result`` is null. Another
  language, ``fetch_files`` outside Python, code or input over this server's size limits, or
  a file that is not base64 answer ``SandboxError`` saying why; a body of the wrong shape
  answers 422 as FastAPI (and so SandboxFusion) does.
  Time and memory limits above this server's maxima are lowered to them.
- A full or unreachable queue answers 504 with Retry-After: the status verl's client retries
  (``call_sandbox_api``, which gives up on a request after compile_timeout + run_timeout +
  10 s). So does a request not started within its time limit plus
  ``sandboxfusion_start_slack_s``: by then its client has stopped waiting.
- ``fetch_files``: the driver (``cell_driver``) reads them inside the sandbox after the code,
  so a program stopped by a limit returns none.
- ``/run_jupyter``: the cells run in order in one interpreter; a cell's error does not stop
  the next; ``cell_timeout`` raises TimeoutError in the cell; ``total_timeout`` is the limit
  of the whole run. Cells that completed are reported even when the run was cut short (the
  part of the cut cell is in ``driver``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from sandbox_service.api.auth import tenant_of
from sandbox_service.api.compat import (
    OUTCOMES,
    FusionRunStatus,
    Refused,
    native_request,
    return_code,
)
from sandbox_service.api.disconnect import submission
from sandbox_service.api.native import BODY_ERRORS, body_of, json_response, parse
from sandbox_service.api.response_bounds import bounded, bounded_parts
from sandbox_service.cell_program import Cell, Driven, Program, new_nonce, program
from sandbox_service.cell_program import parse as parse_driven
from sandbox_service.executor import languages
from sandbox_service.models import (
    CompileResult,
    ErrorBody,
    ExecuteRequest,
    ExecuteResult,
    JsonFloat,
    JsonInt,
    Mode,
    Status,
)
from sandbox_service.queue.base import QueueFull, QueueUnavailable

router = APIRouter(tags=["SandboxFusion compatible"])
PATHS = frozenset({"/run_code", "/run_jupyter", "/v1/ping"})  # sandboxfusion_tenant's reach

NAMES = {"timeout_s": "run_timeout", "memory_mb": "memory_limit_MB"}


# verl's clients send null for a limit they leave unset (``default_compute_score`` passes
# ``memory_limit_mb=None`` down to the payload): null means the default, as -1 does.
RUN_TIMEOUT_S = 10.0
NOTEBOOK_TIMEOUT_S = 45.0
MemoryLimitMB = Annotated[
    JsonInt | None, Field(description="Memory limit; -1 or null: the server's default.")
]


class RunCodeRequest(BaseModel):
    compile_timeout: JsonFloat | None = Field(
        10, description="Ignored: a compile's limits are its language's (30 s for cpp and java)."
    )
    run_timeout: JsonFloat | None = Field(
        RUN_TIMEOUT_S, description="Wall-clock limit in seconds; null: 10."
    )
    memory_limit_MB: MemoryLimitMB = -1
    code: str
    stdin: str | None = None
    language: str = Field(description="python, cpp, java or nodejs.")
    files: dict[str, str | None] = Field({}, description="Relative path -> base64 content.")
    fetch_files: list[str] = Field([], description="Paths read back (base64) after the run.")
    args: list[str] = Field([], description="Ignored (pytest arguments in SandboxFusion).")


RunStatus = FusionRunStatus
OverallStatus = Literal["Success", "Failed", "SandboxError"]


class CommandRunResult(BaseModel):
    status: RunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: OverallStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


class RunJupyterRequest(BaseModel):
    cells: list[str]
    cell_timeout: JsonFloat | None = Field(
        0, description="Limit of each cell in seconds; 0 or null: none."
    )
    total_timeout: JsonFloat | None = Field(
        NOTEBOOK_TIMEOUT_S, description="Limit of the whole run in seconds; null: 45."
    )
    memory_limit_MB: MemoryLimitMB = -1
    kernel: Literal["python3"] = "python3"
    files: dict[str, str] = {}
    fetch_files: list[str] = []


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    error: list[dict[str, Any]]


class RunJupyterResponse(BaseModel):
    status: OverallStatus
    message: str
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


def _limits(
    request: Request, timeout_s: float | None, memory_limit_mb: int | None, default_s: float
) -> dict[str, Any]:
    """SandboxFusion has no maxima, and its clients send their defaults (45 s for a notebook)
    explicitly: limits above this server's maxima are lowered to them, not refused."""
    settings = request.app.state.settings
    timeout = default_s if timeout_s is None else timeout_s
    fields: dict[str, Any] = {"timeout_s": min(timeout, settings.max_timeout_s)}
    if memory_limit_mb is not None and memory_limit_mb > 0:  # otherwise the server's default
        fields["memory_mb"] = min(memory_limit_mb, settings.max_memory_mb)
    return fields


def command_result(result: ExecuteResult, stdout: str, stderr: str) -> CommandRunResult:
    outcome = OUTCOMES[result.status]
    if not outcome.ran:
        return CommandRunResult(status="Error", stderr=result.message)
    code = None if outcome.fusion == "TimeLimitExceeded" else return_code(result)
    if outcome.stopped and not code:  # it may have exited 0 after passing a limit
        code = None
    return CommandRunResult(
        status=outcome.fusion,
        execution_time=result.wall_time_s,
        return_code=code,
        stdout=stdout,
        stderr=stderr,
    )


def compile_command(compiled: CompileResult | None) -> CommandRunResult | None:
    """SandboxFusion's ``compile_result``: ``TimeLimitExceeded`` past the compile's time,
    else ``Finished`` with the compiler's exit status, never 0 for a failed compile."""
    if compiled is None:
        return None
    if compiled.status is Status.timeout:
        return CommandRunResult(status="TimeLimitExceeded", execution_time=compiled.wall_time_s,
                                stdout=compiled.stdout, stderr=compiled.stderr)  # fmt: skip
    code = compiled.exit_code if compiled.exit_code is not None else -(compiled.signal or 9)
    if compiled.status is not Status.ok and code == 0:
        code = 1  # it exited 0 but left nothing to run (message says what)
    stderr = compiled.stderr or compiled.message
    return CommandRunResult(status="Finished", execution_time=compiled.wall_time_s,
                            return_code=code, stdout=compiled.stdout, stderr=stderr)  # fmt: skip


def run_status(
    command: CommandRunResult | None,
    result: ExecuteResult,
    compiled: CommandRunResult | None = None,
) -> tuple[OverallStatus, str]:
    """(status, message) as SandboxFusion's ``parse_run_status`` decides them: the compile
    step first, then the run; a run stopped by a limit is ``Failed`` whatever its exit code,
    the limit in the message."""
    steps = [step for step in (compiled, command) if step is not None]
    for step in steps:
        if step.status == "Error":
            return "SandboxError", step.stderr or ""
    if OUTCOMES[result.status].stopped:
        return "Failed", result.message
    if any(s.status == "TimeLimitExceeded" or s.return_code != 0 for s in steps):
        return "Failed", ""
    return "Success", ""


def _busy(request: Request, why: str, retry: int | None = None) -> Response:
    """504, which verl's client retries (a sandbox busy or unreachable for now)."""
    request.app.state.runtime.metrics.refused.labels("504").inc()
    retry = retry or request.app.state.settings.retry_after_s
    return JSONResponse({"detail": why}, status_code=504, headers={"Retry-After": str(retry)})


async def _execute(
    request: Request, native: ExecuteRequest, wrapped: Program | None, nonce: str
) -> tuple[ExecuteResult, Driven] | Response:
    """Run ``native`` (as the driver program ``wrapped``, when given) and take its output
    apart; a Response when the queue cannot take it."""
    if wrapped is not None:  # limits were checked on the caller's code, not on the driver
        native = native.model_copy(update={"code": wrapped.code, "stdin": wrapped.stdin})
    asked = submission(request, [native])
    asked.start_within_s = native.timeout_s + request.app.state.settings.sandboxfusion_start_slack_s
    try:
        [result] = await request.app.state.runtime.queue.run(asked)
    except (QueueFull, QueueUnavailable) as exc:
        return _busy(request, str(exc), getattr(exc, "retry_after", None))
    if result.status is Status.queue_timeout:  # its client gives up about now: it may retry
        return _busy(request, f"this sandbox is busy: {result.message}; retry")
    if wrapped is None:
        return result, Driven(outputs=[result.stdout], errors=[result.stderr])
    return result, parse_driven(result.stdout, result.stderr, nonce)


def _language(name: str, fetch_files: list[str]) -> str:
    """The table's name for SandboxFusion's ``language``, or ``Refused``."""
    try:
        language = languages.lookup(name).name
    except languages.UnknownLanguage:
        runs = ", ".join(languages.NAMES)
        raise Refused(
            f"language {name!r} is not supported here: this sandbox runs {runs}"
        ) from None
    if fetch_files and language != "python":
        raise Refused(f"fetch_files is supported for python only here, not {name!r}")
    return language


def _code_request(body: RunCodeRequest, request: Request) -> ExecuteRequest:
    language = _language(body.language, body.fetch_files)
    files = {path: data for path, data in body.files.items() if data is not None}
    return native_request(
        request.app.state.settings,
        NAMES,
        tenant_of(request),
        code=body.code,
        stdin=body.stdin or "",
        language=language,
        files=files,
        **_limits(request, body.run_timeout, body.memory_limit_MB, RUN_TIMEOUT_S),
    )


FRONT_ERRORS: dict[int | str, dict[str, Any]] = {
    **BODY_ERRORS,
    504: {"model": ErrorBody, "description": "queue full or unreachable; retry after Retry-After"},
}


@router.get("/v1/ping", summary="SandboxFusion liveness: answers 'pong'")
async def ping() -> str:
    return "pong"


@router.post(
    "/run_code",
    response_model=RunCodeResponse,
    responses=FRONT_ERRORS,
    openapi_extra=body_of(RunCodeRequest),
    summary="Run one program (SandboxFusion's API)",
)
async def run_code(request: Request) -> Response:
    body = await parse(request, RunCodeRequest)
    try:
        native = _code_request(body, request)
    except Refused as exc:
        return json_response(RunCodeResponse(status="SandboxError", message=str(exc)))
    nonce = new_nonce()
    wrapped = (
        program([Cell(body.code, "script", native.stdin)], nonce, fetch=body.fetch_files)
        if body.fetch_files
        else None
    )
    ran = await _execute(request, native, wrapped, nonce)
    if isinstance(ran, Response):
        return ran
    result, driven = ran
    compiled = compile_command(result.compile)
    command = None
    if result.status is not Status.compile_error:  # SandboxFusion runs nothing after one
        streams = {"stdout": driven.stdout, "stderr": driven.stderr}
        [sent] = bounded([result.model_copy(update=streams)], request.app.state.settings)
        command = command_result(result, sent.stdout, sent.stderr)
    status, message = run_status(command, result, compiled)
    return json_response(
        RunCodeResponse(
            status=status,
            message=message,
            compile_result=compiled,
            run_result=command,
            executor_pod_name=result.worker or None,
            files=driven.files,
        )
    )


def _cells(driven: Driven) -> list[CellRunResult]:
    return [
        CellRunResult(stdout=out, stderr=err, display=report["display"], error=report["error"])
        for report, out, err in zip(driven.cells, driven.outputs, driven.errors, strict=False)
    ]


@router.post(
    "/run_jupyter",
    response_model=RunJupyterResponse,
    responses=FRONT_ERRORS,
    openapi_extra=body_of(RunJupyterRequest),
    summary="Run notebook cells in one interpreter (SandboxFusion's API)",
)
async def run_jupyter(request: Request) -> Response:
    body = await parse(request, RunJupyterRequest)
    try:
        native = native_request(
            request.app.state.settings,
            {"code": "cells", "timeout_s": "total_timeout", "memory_mb": "memory_limit_MB"},
            tenant_of(request),
            code="\n".join(body.cells),
            files=body.files,
            **_limits(request, body.total_timeout, body.memory_limit_MB, NOTEBOOK_TIMEOUT_S),
        )
    except Refused as exc:
        return json_response(RunJupyterResponse(status="SandboxError", message=str(exc)))
    nonce = new_nonce()
    cells = [Cell(c, Mode.repl.value, "") for c in body.cells]
    wrapped = program(
        cells, nonce, notebook=True, fetch=body.fetch_files, cell_timeout_s=body.cell_timeout or 0
    )
    ran = await _execute(request, native, wrapped, nonce)
    if isinstance(ran, Response):
        return ran
    result, driven = ran
    settings = request.app.state.settings
    driven.outputs, driven.errors = bounded_parts(driven.outputs, driven.errors, settings)
    done = len(driven.cells)  # a cell cut short has output but no report: it goes to driver
    rest = "".join(driven.outputs[done:]), "".join(driven.errors[done:])
    command = command_result(result, *rest)
    status, message = run_status(command, result)
    return json_response(
        RunJupyterResponse(
            status=status,
            message=message,
            driver=command,
            cells=_cells(driven),
            executor_pod_name=result.worker or None,
            files=driven.files,
        )
    )
