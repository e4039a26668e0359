"""The native API: ``POST /v1/execute`` and ``POST /v1/execute/batch``, as DESIGN.md fixes them.

Bodies are parsed straight from bytes by pydantic (faster than FastAPI's json-then-validate,
and indifferent to the Content-Type a quick ``curl -d`` sends); the schemas still appear in
the OpenAPI document. Results of a batch come back in request order.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from sandbox_service.api import policy
from sandbox_service.api.auth import tenant_of
from sandbox_service.api.body_bounds import check_values
from sandbox_service.api.disconnect import submission
from sandbox_service.api.errors import from_validation_error
from sandbox_service.api.response_bounds import bounded
from sandbox_service.models import (
    BatchRequest,
    BatchResponse,
    ErrorBody,
    ExecuteRequest,
    ExecuteResult,
)

router = APIRouter(tags=["execute"])
M = TypeVar("M", bound=BaseModel)

# What a route that parses its own body may answer besides 200 (the compatibility fronts
# answer queue trouble in their own way, so they document only the first two).
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorBody, "description": "body over the server's limit"},
    422: {"model": ErrorBody, "description": "invalid request; each problem names its field"},
}
ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorBody, "description": "code, inputs or body over the server's limit"},
    422: {"model": ErrorBody, "description": "invalid request; each problem names its field"},
    401: {"model": ErrorBody, "description": "auth on: missing or invalid API key"},
    429: {
        "model": ErrorBody,
        "description": "queue full, or the key's tenant over a quota (named); retry after "
        "the Retry-After header",
    },
    503: {"model": ErrorBody, "description": "shutting down or queue unreachable"},
}


def body_of(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI request body referring to ``model`` (its schema is added by create_app)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


async def parse(request: Request, model: type[M]) -> M:
    body = await request.body()
    await check_values(body, request.app.state.settings.max_body_values)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


@router.post(
    "/v1/execute",
    response_model=ExecuteResult,
    responses=ERRORS,
    openapi_extra=body_of(ExecuteRequest),
    summary="Run one program",
)
async def execute(request: Request) -> Response:
    execute_request = await parse(request, ExecuteRequest)
    tenant = tenant_of(request)
    policy.check_one(execute_request, request.app.state.settings, tenant)
    queue = request.app.state.runtime.queue
    sessions = request.app.state.sessions
    [result] = await sessions.submit(queue, submission(request, [execute_request]), batch=False)
    [result] = bounded([result], request.app.state.settings)
    return json_response(result)


@router.post(
    "/v1/execute/batch",
    response_model=BatchResponse,
    responses=ERRORS,
    openapi_extra=body_of(BatchRequest),
    summary="Run many programs; results in request order",
)
async def execute_batch(request: Request) -> Response:
    batch = await parse(request, BatchRequest)
    tenant = tenant_of(request)
    policy.check_batch(batch.requests, request.app.state.settings, tenant)
    queue = request.app.state.runtime.queue
    results = await request.app.state.sessions.submit(queue, submission(request, batch.requests))
    results = bounded(results, request.app.state.settings)
    return json_response(BatchResponse(results=results))
