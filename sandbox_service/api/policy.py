"""The API's policy: what this server accepts, checked against the settings' maxima.

The models check shape and sanity (types, positive limits, safe file paths, base64); this
module checks a well-formed request against what this deployment allows. The executor
enforces whatever it is given and decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandbox_service.api.errors import RequestRejected
from sandbox_service.models import ErrorDetail, ExecuteRequest
from sandbox_service.settings import Settings


def _too_large(loc: list[str | int], what: str, size: int, limit: int) -> ErrorDetail:
    return ErrorDetail(
        loc=loc,
        msg=f"{what} is {size}; this server accepts at most {limit}",
        type="too_large",
        ctx={"limit": limit, "size": size},
    )


def problems(
    request: ExecuteRequest, settings: Settings, loc: list[str | int]
) -> list[ErrorDetail]:
    """What is wrong with one request; sizes come first because they answer 413.

    A limit the caller left at its default is lowered to the server's maximum instead of
    refused: only an explicit ``timeout_s`` or ``memory_mb`` over the maximum is an error.
    """
    given = request.model_fields_set
    if "timeout_s" not in given:
        request.timeout_s = min(request.timeout_s, settings.max_timeout_s)
    if "memory_mb" not in given:
        request.memory_mb = min(request.memory_mb, settings.max_memory_mb)
    found = []
    if len(request.code) > settings.max_code_chars:
        size = len(request.code)
        found.append(
            _too_large([*loc, "code"], "code, in characters,", size, settings.max_code_chars)
        )
    if len(request.stdin) > settings.max_stdin_chars:
        size = len(request.stdin)
        found.append(
            _too_large([*loc, "stdin"], "stdin, in characters,", size, settings.max_stdin_chars)
        )
    files = sum(len(d) * 3 // 4 for d in request.files.values())
    if files > settings.max_files_bytes:
        found.append(
            _too_large(
                [*loc, "files"], "files, decoded, in bytes,", files, settings.max_files_bytes
            )
        )
    if request.timeout_s > settings.max_timeout_s:
        found.append(ErrorDetail(
            loc=[*loc, "timeout_s"],
            msg=f"timeout_s must be at most {settings.max_timeout_s:g} on this server",
            type="less_than_equal",
            ctx={"limit": settings.max_timeout_s},
        ))  # fmt: skip
    if request.memory_mb > settings.max_memory_mb:
        found.append(ErrorDetail(
            loc=[*loc, "memory_mb"],
            msg=f"memory_mb must be at most {settings.max_memory_mb} on this server",
            type="less_than_equal",
            ctx={"limit": settings.max_memory_mb},
        ))  # fmt: skip
    return found


def _raise(found: list[ErrorDetail]) -> None:
    if found:
        status = 413 if any(d.type == "too_large" for d in found) else 422
        raise RequestRejected(status, found)


def check_one(request: ExecuteRequest, settings: Settings) -> None:
    _raise(problems(request, settings, ["body"]))


def check_batch(requests: Sequence[ExecuteRequest], settings: Settings) -> None:
    if len(requests) > settings.max_batch:
        _raise([ErrorDetail(
            loc=["body", "requests"],
            msg=f"batch of {len(requests)} requests; at most {settings.max_batch} per batch",
            type="too_long",
            ctx={"limit": settings.max_batch, "size": len(requests)},
        )])  # fmt: skip
    found: list[ErrorDetail] = []
    for i, request in enumerate(requests):
        found.extend(problems(request, settings, ["body", "requests", i]))
    _raise(found)
