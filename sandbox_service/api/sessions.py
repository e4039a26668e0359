"""Sessions as a resource: ``GET`` and ``DELETE /v1/sessions/{session_id}``.

A session is created by the first execution that names it (``session_id``); see
``sandbox_service/session_replay.py`` for what it keeps and how.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sandbox_service.api.auth import tenant_of
from sandbox_service.models import ErrorBody

router = APIRouter(tags=["sessions"])


class SessionInfo(BaseModel):
    session_id: str
    cells: int
    files: list[str]
    idle_s: float
    expires_in_s: float


def _missing(session_id: str) -> JSONResponse:
    return JSONResponse(
        {"detail": f"no session {session_id!r} (never used, expired or ended)"}, status_code=404
    )


@router.get(
    "/v1/sessions/{session_id}",
    response_model=SessionInfo,
    responses={404: {"model": ErrorBody, "description": "no such session"}},
    summary="What a session holds",
)
async def session_info(session_id: str, request: Request) -> Response:
    sessions = request.app.state.sessions
    session = sessions.peek(session_id, tenant_of(request).name)
    if session is None:
        return _missing(session_id)
    idle = time.monotonic() - session.used_at
    info = SessionInfo(
        session_id=session_id,
        cells=len(session.cells),
        files=sorted(session.files),
        idle_s=round(idle, 3),
        expires_in_s=round(sessions.ttl_s - idle, 3),
    )
    return Response(info.model_dump_json(), media_type="application/json")


@router.delete(
    "/v1/sessions/{session_id}",
    status_code=204,
    responses={404: {"model": ErrorBody, "description": "no such session"}},
    summary="End a session and forget its state",
)
async def end_session(session_id: str, request: Request) -> Response:
    if not request.app.state.sessions.drop(session_id, tenant_of(request).name):
        return _missing(session_id)
    return Response(status_code=204)
