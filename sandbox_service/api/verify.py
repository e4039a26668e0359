"""``POST /v1/verify``: math answers checked against references, inside the sandbox slots.

A response's last ``\\boxed{}`` (optionally only inside ``<answer>``) is compared with its
reference by ``sandbox_service.math_answer`` (math-verify), the same code the trainer's reward
uses. It runs as ordinary executions, not in the API process: sympy can be made to hang by an
adversarial expression, and a slot bounds that with its timeout and its kill. Items go in
chunks (one import of math-verify, ~0.3 s unless preloaded, serves a chunk); each item is
also bounded by math-verify's own alarm; an item whose chunk was cut short is run again
alone, and if that is cut short too it is answered wrong with the reason.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, StrictBool

from sandbox_service.api.disconnect import submission
from sandbox_service.api.native import ERRORS, body_of, json_response, parse
from sandbox_service.cell_program import new_nonce
from sandbox_service.models import (
    ErrorDetail,
    ExecuteRequest,
    ExecuteResult,
    JsonFloat,
    RequestRejected,
)

router = APIRouter(tags=["verify"])

CHUNK = 16
IMPORT_SLACK_S = 10.0  # importing math-verify in a child that did not preload it
MAX_ITEMS = 10_000
MAX_ITEM_TIMEOUT_S = 60.0


class VerifyItem(BaseModel):
    response: str = Field(description="The model's answer text; its last \\boxed{} is checked.")
    reference: str = Field(description="The reference answer, bare (12) or boxed.")
    require_answer_tag: StrictBool = Field(
        default=False, description="Only a \\boxed{} inside the last <answer>...</answer> counts."
    )


class VerifyRequest(BaseModel):
    items: list[VerifyItem] = Field(min_length=1, max_length=MAX_ITEMS)
    timeout_s: JsonFloat = Field(
        default=5.0, gt=0, le=MAX_ITEM_TIMEOUT_S, description="Limit per item."
    )


class VerifyResult(BaseModel):
    correct: bool
    prediction: str | None = None
    parsed_prediction: str | None = None
    parsed_reference: str | None = None
    error: str | None = None


class VerifyResponse(BaseModel):
    results: list[VerifyResult]


# Runs in the sandbox: stdin carries the items; each verdict is printed between nonces as soon
# as it is known, so the verdicts before a hang survive the kill.
PROGRAM = """\
import json, sys
from sandbox_service.math_answer import verify
spec = json.loads(sys.stdin.read())
nonce = spec["nonce"]
for index, item in spec["items"]:
    v = verify(item["response"], item["reference"],
               require_answer_tag=item["require_answer_tag"], timeout_s=spec["timeout_s"])
    print(nonce + json.dumps({"index": index, **v.__dict__}) + nonce, flush=True)
"""


def _request(indexed: list[tuple[int, VerifyItem]], timeout_s: float, nonce: str) -> ExecuteRequest:
    per_item = max(1, round(timeout_s))  # math-verify's alarm takes whole seconds
    spec = {
        "nonce": nonce,
        "timeout_s": per_item,
        "items": [(i, item.model_dump()) for i, item in indexed],
    }
    return ExecuteRequest(
        code=PROGRAM,
        stdin=json.dumps(spec),
        timeout_s=len(indexed) * per_item * 2 + IMPORT_SLACK_S,
    )


def _verdicts(result: ExecuteResult, nonce: str) -> dict[int, VerifyResult]:
    found = {}
    for text in result.stdout.split(nonce)[1::2]:
        try:
            event = json.loads(text)
            found[int(event.pop("index"))] = VerifyResult.model_validate(event)
        except (ValueError, TypeError, KeyError):
            continue
    return found


def _unfinished(result: ExecuteResult, timeout_s: float) -> VerifyResult:
    if result.status.value == "timeout":
        why = f"verification did not finish within {timeout_s:g} s"
    elif "No module named 'math_verify'" in result.stderr:
        why = "math-verify is not installed on this server"
    else:
        tail = (result.stderr.strip().splitlines() or [result.message or result.status.value])[-1]
        why = f"verification failed ({result.status.value}): {tail}"
    return VerifyResult(correct=False, error=why)


async def verify_all(request: Request, body: VerifyRequest) -> list[VerifyResult]:
    queue = request.app.state.runtime.queue
    indexed = list(enumerate(body.items))
    chunks = [indexed[i : i + CHUNK] for i in range(0, len(indexed), CHUNK)]
    nonce = new_nonce()
    asked = submission(request, [_request(c, body.timeout_s, nonce) for c in chunks])
    ran = await queue.run(asked)
    verdicts: dict[int, VerifyResult] = {}
    for result in ran:
        verdicts.update(_verdicts(result, nonce))
    missing = [pair for pair in indexed if pair[0] not in verdicts]
    if missing:  # a chunk was cut short: each of its unanswered items alone
        alone = await queue.run(asked.part([_request([p], body.timeout_s, nonce) for p in missing]))
        for (index, _), result in zip(missing, alone, strict=True):
            found = _verdicts(result, nonce)
            verdicts[index] = found.get(index) or _unfinished(result, body.timeout_s)
    return [verdicts[i] for i in range(len(body.items))]


@router.post(
    "/v1/verify",
    response_model=VerifyResponse,
    responses=ERRORS,
    openapi_extra=body_of(VerifyRequest),
    summary="Check math answers against references (math-verify, in the sandbox)",
)
async def verify(request: Request) -> Response:
    body = await parse(request, VerifyRequest)
    limit = request.app.state.settings.max_timeout_s
    if body.timeout_s > limit:
        raise RequestRejected(422, [ErrorDetail(
            loc=["body", "timeout_s"], msg=f"timeout_s must be at most {limit:g} on this server",
            type="less_than_equal", ctx={"limit": limit},
        )])  # fmt: skip
    results = await verify_all(request, body)
    return json_response(VerifyResponse(results=results))
