"""code-judge's API: ``/run``, ``/run/batch``, ``/run/long-batch``, the same under ``/judge``,
``GET /ping`` and ``GET /status``.

What the rStar2-Agent release sends its tool calls to (``rstar2_agent/tools/code_judge_utils.py``
posts ``{"type": "batch", "submissions": [...]}`` to ``http://{host_addr}:{host_port}/run/
long-batch`` and reads ``run_success``, ``success``, ``stdout``, ``stderr``, ``reason``,
``cost``). Shapes follow the code-judge project (``app/model.py``, ``app/main.py``, its README
and ``judge_client.py``):

- A submission: ``sub_id`` (a uuid when absent), ``type``, ``options``, ``solution``,
  ``input`` (stdin), ``expected_output``. ``type: python`` and ``cpp`` run here (C++ compiled
  with ``g++ -O2 -std=c++17``, once per solution: the service's compile cache); a compile
  error is ``run_success: false`` with the compiler's diagnostics in ``stderr`` and no
  ``reason`` (the submission's fault, as code-judge reports it). ``math`` answers ``reason:
  invalid_input``, as does anything over this server's limits.
  ``options`` is accepted and ignored. A body of the wrong shape answers 422 (FastAPI's, as
  code-judge's); otherwise the answer is always 200, with one result per submission in order.
- A result: ``run_success`` (exit status 0), ``success`` (``run_success`` and, when
  ``expected_output`` is given, stdout equal to it after stripping both), ``cost`` (seconds
  it ran; seconds it waited when it never ran), ``stdout`` and ``stderr`` (cut to
  ``codejudge_max_output_chars``), ``reason`` from ``compat.OUTCOMES``. ``/judge`` answers
  leave out stdout and stderr.
- Time and memory limits are the server's (``codejudge_timeout_s``, ``codejudge_memory_mb``),
  as code-judge's are. A full queue answers the items it could not take ``queue_timeout``
  (code-judge clients send those again); batches and long batches both wait up to
  ``max_queue_wait_s`` for a slot.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from sandbox_service.api.auth import tenant_of
from sandbox_service.api.compat import OUTCOMES, Refused, native_request
from sandbox_service.api.native import BODY_ERRORS, body_of, json_response, parse
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.queue.base import Queue, QueueFull, QueueUnavailable
from sandbox_service.settings import Settings
from sandbox_service.tenants import Tenant

router = APIRouter(tags=["code-judge compatible"])
# codejudge_tenant's reach: every route of this front.
PATHS = frozenset({"/run", "/run/batch", "/run/long-batch", "/judge", "/judge/batch",
                   "/judge/long-batch", "/ping", "/status"})  # fmt: skip

NAMES = {
    "code": "solution",
    "stdin": "input",
    "timeout_s": "codejudge_timeout_s",
    "memory_mb": "codejudge_memory_mb",
}


class Reason(str, enum.Enum):
    none = ""
    internal_error = "internal_error"
    worker_timeout = "worker_timeout"
    queue_timeout = "queue_timeout"
    invalid_input = "invalid_input"


class Submission(BaseModel):
    sub_id: str | None = None
    type: Literal["python", "cpp", "math"]
    options: dict[str, str] | None = None
    solution: str
    input: str | None = None
    expected_output: str | None = None


class BatchSubmission(BaseModel):
    sub_id: str | None = None
    type: Literal["batch"] = "batch"
    submissions: list[Submission] = Field(min_length=1)


class JudgeResult(BaseModel):
    sub_id: str
    success: bool
    run_success: bool
    cost: float
    reason: Reason = Reason.none


class SubmissionResult(JudgeResult):
    stdout: str | None = None
    stderr: str | None = None


class BatchSubmissionResult(BaseModel):
    sub_id: str
    results: list[SubmissionResult]


class BatchJudgeResult(BaseModel):
    sub_id: str
    results: list[JudgeResult]


class ServerStatus(BaseModel):
    queue: int
    num_workers: int


LANGUAGES = {"python": "python", "cpp": "cpp"}  # code-judge's types this sandbox runs


def _native(sub: Submission, settings: Settings, tenant: Tenant) -> ExecuteRequest:
    if sub.type not in LANGUAGES:
        runs = ", ".join(LANGUAGES)
        raise Refused(f"type {sub.type!r} is not supported here: this sandbox runs {runs}")
    return native_request(
        settings,
        NAMES,
        tenant,
        language=LANGUAGES[sub.type],
        code=sub.solution,
        stdin=sub.input or "",
        timeout_s=min(settings.codejudge_timeout_s, settings.max_timeout_s),
        memory_mb=min(settings.codejudge_memory_mb, settings.max_memory_mb),
    )


def _not_run(sub_id: str, reason: Reason, why: str, cost: float = 0.0) -> SubmissionResult:
    return SubmissionResult(
        sub_id=sub_id,
        success=False,
        run_success=False,
        cost=cost,
        stdout="",
        stderr=why,
        reason=reason,
    )


def _cut(text: str, limit: int) -> str:
    return text[:limit] if limit else text


def _result(sub: Submission, sub_id: str, result: ExecuteResult, cut: int) -> SubmissionResult:
    outcome = OUTCOMES[result.status]
    if not outcome.ran:
        return _not_run(sub_id, Reason(outcome.judge), result.message, result.queue_time_s)
    run_success = result.status is Status.ok
    expected = sub.expected_output
    success = run_success and (expected is None or result.stdout.strip() == expected.strip())
    stderr = result.stderr
    if result.status is Status.compile_error and result.compile is not None:
        stderr = result.compile.stderr or result.message  # what code-judge's g++ step prints
    return SubmissionResult(
        sub_id=sub_id,
        success=success,
        run_success=run_success,
        cost=result.wall_time_s,
        stdout=_cut(result.stdout, cut),
        stderr=_cut(stderr, cut),
        reason=Reason(outcome.judge),
    )


async def _chunk(
    queue: Queue, requests: list[ExecuteRequest], tenant: Tenant
) -> list[ExecuteResult]:
    try:
        return await queue.submit(requests, tenant)
    except QueueFull as exc:
        status, why = Status.queue_timeout, str(exc)
    except QueueUnavailable as exc:
        status, why = Status.internal_error, str(exc)
    return [ExecuteResult(status=status, message=why) for _ in requests]


async def judge(request: Request, subs: Sequence[Submission]) -> list[SubmissionResult]:
    """Run every submission; one result each, in order."""
    settings: Settings = request.app.state.settings
    tenant = tenant_of(request)
    ids = [sub.sub_id or str(uuid.uuid4()) for sub in subs]
    natives: list[ExecuteRequest | Refused] = []
    for sub in subs:
        try:
            natives.append(_native(sub, settings, tenant))
        except Refused as exc:
            natives.append(exc)
    runnable = [(i, n) for i, n in enumerate(natives) if isinstance(n, ExecuteRequest)]
    size = min(settings.max_batch, tenant.max_batch or settings.max_batch)
    chunks = [runnable[i : i + size] for i in range(0, len(runnable), size)]
    queue = request.app.state.runtime.queue
    done = await asyncio.gather(*(_chunk(queue, [n for _, n in chunk], tenant) for chunk in chunks))
    results: list[SubmissionResult] = [
        _not_run(sub_id, Reason.invalid_input, str(native))
        for sub_id, native in zip(ids, natives, strict=True)
    ]
    for chunk, chunk_results in zip(chunks, done, strict=True):
        for (i, _), result in zip(chunk, chunk_results, strict=True):
            results[i] = _result(subs[i], ids[i], result, settings.codejudge_max_output_chars)
    return results


def _judged(result: SubmissionResult) -> JudgeResult:
    return JudgeResult.model_validate(result.model_dump(exclude={"stdout", "stderr"}))


@router.get("/ping", summary="code-judge liveness: answers 'pong'")
async def ping() -> str:
    return "pong"


@router.get("/status", response_model=ServerStatus, summary="code-judge status: queue, workers")
async def status(request: Request) -> Response:
    report = await request.app.state.runtime.status()
    slots = sum(worker.slots for worker in report.workers)
    return json_response(ServerStatus(queue=report.queue_depth, num_workers=slots))


def _endpoint(batch: bool, judged: bool) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint for one submission or a batch, answering full results or judged ones."""

    async def endpoint(request: Request) -> Response:
        if not batch:
            [result] = await judge(request, [await parse(request, Submission)])
            return json_response(_judged(result) if judged else result)
        subs = await parse(request, BatchSubmission)
        results = await judge(request, subs.submissions)
        sub_id = subs.sub_id or str(uuid.uuid4())
        if judged:
            return json_response(
                BatchJudgeResult(sub_id=sub_id, results=[_judged(r) for r in results])
            )
        return json_response(BatchSubmissionResult(sub_id=sub_id, results=results))

    return endpoint


# A batch and a long batch differ in code-judge only by how long they may wait for workers;
# here both wait up to max_queue_wait_s.
for _path, _batch, _judged_only, _model, _summary in [
    ("/run", False, False, SubmissionResult, "Run one submission"),
    ("/judge", False, True, JudgeResult, "Judge one submission"),
    ("/run/batch", True, False, BatchSubmissionResult, "Run submissions"),
    ("/run/long-batch", True, False, BatchSubmissionResult, "Run submissions"),
    ("/judge/batch", True, True, BatchJudgeResult, "Judge submissions"),
    ("/judge/long-batch", True, True, BatchJudgeResult, "Judge submissions"),
]:
    router.add_api_route(
        _path,
        _endpoint(_batch, _judged_only),
        methods=["POST"],
        response_model=_model,
        responses=BODY_ERRORS,
        openapi_extra=body_of(BatchSubmission if _batch else Submission),
        operation_id="codejudge_" + _path.strip("/").replace("/", "_").replace("-", "_"),
        summary=f"{_summary} (code-judge's API; results in order)",
    )
