"""Health, readiness, status and metrics: what probes, operators and autoscalers read."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandbox_service.metrics import CONTENT_TYPE
from sandbox_service.models import StatusReport

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Slots are up and the queue is reachable", responses={503: {}})
async def readyz(request: Request) -> JSONResponse:
    ok, why = await request.app.state.runtime.ready()
    if ok:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": why}, status_code=503)


@router.get("/v1/status", response_model=StatusReport, summary="Queue, workers, slots, isolation")
async def status(request: Request) -> Response:
    report = await request.app.state.runtime.status()
    return Response(report.model_dump_json(), media_type="application/json")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.runtime.metrics.render(), media_type=CONTENT_TYPE)
