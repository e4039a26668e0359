"""``POST /v1/grade``: a program tested by the service, with expected values that never enter
the sandbox.

Assert-style grading (a test appended to the program, verl's assert cases, an assert cell after
a notebook) runs the checks in the program's own process, where the program can skip them
(``os._exit(0)`` before they run, from its last line or from a thread racing them) or change
them. Here each case is an execution of its own and the comparison is the API's:

- a **stdin/stdout case** (``stdin``, ``expected_stdout``) runs the program on ``stdin``; it
  passes when the run is ``ok`` and its stdout equals ``expected_stdout`` after stripping both
  (code-judge's rule);
- a **call case** (``args``, ``expected``) runs the program's code in a fresh module named
  ``__solution__`` (so ``if __name__ == "__main__":`` blocks do not run), calls ``function``
  with ``args`` (JSON) and prints the result as JSON between nonces; it passes when the run is
  ``ok``, exactly one result came back, and it equals ``expected`` as JSON values.

Nothing of ``expected_stdout`` or ``expected`` is sent to the sandbox. What the program can
still do is what any answer can: print or return a value; exiting early leaves a case without
its output or result, which fails it.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sandbox_service.api.auth import tenant_of
from sandbox_service.api.native import ERRORS, body_of, json_response, parse
from sandbox_service.cell_program import new_nonce
from sandbox_service.models import (
    ErrorDetail,
    ExecuteRequest,
    ExecuteResult,
    JsonFloat,
    JsonInt,
    RequestRejected,
    Status,
)
from sandbox_service.settings import Settings

router = APIRouter(tags=["grade"])

MAX_CASES = 1_000

# Runs in the sandbox: stdin carries the code, the function's name, its arguments and the nonce.
CALLER = """\
import json, sys, types
spec = json.loads(sys.stdin.read())
solution = types.ModuleType("__solution__")
sys.modules["__solution__"] = solution
exec(compile(spec["code"], "<string>", "exec"), solution.__dict__)
result = getattr(solution, spec["function"])(*spec["args"])
sys.stdout.write(spec["nonce"] + json.dumps({"result": result}) + spec["nonce"])
"""


class GradeCase(BaseModel):
    # Exactly one kind of case, as the route checks it (so that the schema says so too).
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["expected_stdout"],
                 "properties": {"expected_stdout": {"type": "string"}, "args": {"type": "null"}}},
                {"required": ["args"],
                 "properties": {"args": {"type": "array"}, "expected_stdout": {"type": "null"}}},
            ]
        }
    )  # fmt: skip
    stdin: str | None = Field(default=None, description="A stdin/stdout case: the input.")
    expected_stdout: str | None = Field(
        default=None, description="A stdin/stdout case: the output (compared stripped)."
    )
    args: list[JsonValue] | None = Field(
        default=None, description="A call case: the function's positional arguments (JSON)."
    )
    expected: JsonValue = Field(default=None, description="A call case: the return value.")


class GradeRequest(BaseModel):
    # Call cases need the function they call.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["cases"], "properties": {"cases": {"contains": {
                "required": ["args"], "properties": {"args": {"type": "array"}}}}}},
            "then": {"required": ["function"],
                     "properties": {"function": {"type": "string", "minLength": 1}}},
        }
    )  # fmt: skip
    code: str = Field(description="The program under test.")
    function: str | None = Field(
        default=None, description="The function that call cases call (defined by the code)."
    )
    cases: list[GradeCase] = Field(min_length=1, max_length=MAX_CASES)
    timeout_s: JsonFloat = Field(default=5.0, gt=0, description="Limit per case.")
    memory_mb: JsonInt = Field(default=1024, gt=0, description="Limit per case.")


class CaseResult(BaseModel):
    passed: bool
    status: Status
    stdout: str = ""
    stderr: str = ""
    why: str = ""


class GradeResponse(BaseModel):
    passed: bool
    results: list[CaseResult]


def _rejected(field: str, msg: str) -> RequestRejected:
    return RequestRejected(422, [ErrorDetail(loc=["body", field], msg=msg, type="value_error")])


def _check(body: GradeRequest, settings: Settings) -> None:
    sizes: list[tuple[list[str | int], int, int]] = [
        (["body", "code"], len(body.code), settings.max_code_chars)
    ]
    sizes += [(["body", "cases", i, "stdin"], len(c.stdin or ""), settings.max_stdin_chars)
              for i, c in enumerate(body.cases)]  # fmt: skip
    too_large = [
        ErrorDetail(loc=loc, msg=f"{loc[-1]} is {size} characters; this server accepts at most "
                    f"{limit}", type="too_large", ctx={"limit": limit, "size": size})
        for loc, size, limit in sizes
        if size > limit
    ]  # fmt: skip
    if too_large:
        raise RequestRejected(413, too_large)
    if body.timeout_s > settings.max_timeout_s:
        limit = settings.max_timeout_s
        raise _rejected("timeout_s", f"timeout_s must be at most {limit:g} on this server")
    if body.memory_mb > settings.max_memory_mb:
        limit = settings.max_memory_mb
        raise _rejected("memory_mb", f"memory_mb must be at most {limit} on this server")
    for case in body.cases:
        if (case.expected_stdout is None) == (case.args is None):
            raise _rejected("cases", "each case has either expected_stdout or args")
        if case.args is not None and not body.function:
            raise _rejected("function", "call cases need the function to call")


def _request(body: GradeRequest, case: GradeCase, nonce: str) -> ExecuteRequest:
    limits: dict[str, Any] = {"timeout_s": body.timeout_s, "memory_mb": body.memory_mb}
    if case.args is None:
        return ExecuteRequest(code=body.code, stdin=case.stdin or "", **limits)
    spec = {"code": body.code, "function": body.function, "args": case.args, "nonce": nonce}
    return ExecuteRequest(code=CALLER, stdin=json.dumps(spec), **limits)


def judge_case(case: GradeCase, result: ExecuteResult, nonce: str) -> CaseResult:
    """Whether ``result`` passes ``case``: decided here, from what came out of the sandbox."""
    status, stderr = result.status, result.stderr[-4000:]
    if result.status is not Status.ok:
        why = result.message or f"the run ended {result.status.value}"
        return CaseResult(
            passed=False, stdout=result.stdout[-4000:], why=why, status=status, stderr=stderr
        )
    if case.args is None:
        passed = result.stdout.strip() == (case.expected_stdout or "").strip()
        return CaseResult(passed=passed, stdout=result.stdout[-4000:], status=status, stderr=stderr)
    frames = result.stdout.split(nonce)
    if len(frames) != 3:
        why = f"{(len(frames) - 1) // 2} results came back, not one"
        return CaseResult(
            passed=False, stdout=result.stdout[-4000:], why=why, status=status, stderr=stderr
        )
    try:
        returned = json.loads(frames[1])["result"]
    except (ValueError, KeyError, TypeError):
        return CaseResult(passed=False, why="the result is not JSON", status=status, stderr=stderr)
    shown = json.dumps(returned)[:4000]
    return CaseResult(passed=returned == case.expected, stdout=shown, status=status, stderr=stderr)


@router.post(
    "/v1/grade",
    response_model=GradeResponse,
    responses=ERRORS,
    openapi_extra=body_of(GradeRequest),
    summary="Test a program against cases whose expected values stay outside the sandbox",
)
async def grade(request: Request) -> Response:
    body = await parse(request, GradeRequest)
    _check(body, request.app.state.settings)
    nonce = new_nonce()
    queue, tenant = request.app.state.runtime.queue, tenant_of(request)
    ran = await queue.submit([_request(body, case, nonce) for case in body.cases], tenant)
    results = [judge_case(c, r, nonce) for c, r in zip(body.cases, ran, strict=True)]
    return json_response(GradeResponse(passed=all(r.passed for r in results), results=results))
