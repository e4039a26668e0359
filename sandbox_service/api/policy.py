"""The API's policy: what this server accepts, checked against the settings' maxima.

The models check shape and sanity (types, positive limits, safe file paths, base64); this
module checks a well-formed request against what this deployment allows. The executor
enforces whatever it is given and decides nothing. A tenant's own maxima (``max_batch``,
``max_timeout_s``, ``max_memory_mb`` of its key line) lower the server's, with the same answers
(422 naming the field, defaults lowered rather than refused): a 429 would tell the client to
send the same request again, which cannot help.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandbox_service.models import ErrorDetail, ExecuteRequest, RequestRejected
from sandbox_service.settings import Settings
from sandbox_service.tenants import DEFAULT, Tenant


def _limit(server: float, mine: float, tenant: Tenant, quota: str) -> tuple[float, str]:
    """The lower of the server's maximum and the tenant's, and where it comes from."""
    if mine and mine < server:
        return mine, f"for tenant {tenant.name!r} (its quota {quota})"
    return server, "on this server"


def _too_large(loc: list[str | int], what: str, size: int, limit: int) -> ErrorDetail:
    return ErrorDetail(
        loc=loc,
        msg=f"{what} is {size}; this server accepts at most {limit}",
        type="too_large",
        ctx={"limit": limit, "size": size},
    )


def problems(
    request: ExecuteRequest,
    settings: Settings,
    loc: list[str | int],
    tenant: Tenant = DEFAULT,
) -> list[ErrorDetail]:
    """What is wrong with one request; sizes come first because they answer 413.

    A limit the caller left at its default is lowered to the server's maximum instead of
    refused: only an explicit ``timeout_s`` or ``memory_mb`` over the maximum is an error.
    """
    given = request.model_fields_set
    max_timeout, timeout_where = _limit(
        settings.max_timeout_s, tenant.max_timeout_s, tenant, "max_timeout_s"
    )
    max_memory, memory_where = _limit(
        settings.max_memory_mb, tenant.max_memory_mb, tenant, "max_memory_mb"
    )
    if "timeout_s" not in given:
        request.timeout_s = min(request.timeout_s, max_timeout)
    if "memory_mb" not in given:
        request.memory_mb = min(request.memory_mb, int(max_memory))
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
    if request.timeout_s > max_timeout:
        found.append(ErrorDetail(
            loc=[*loc, "timeout_s"],
            msg=f"timeout_s must be at most {max_timeout:g} {timeout_where}",
            type="less_than_equal",
            ctx={"limit": max_timeout},
        ))  # fmt: skip
    if request.memory_mb > max_memory:
        found.append(ErrorDetail(
            loc=[*loc, "memory_mb"],
            msg=f"memory_mb must be at most {max_memory:g} {memory_where}",
            type="less_than_equal",
            ctx={"limit": max_memory},
        ))  # fmt: skip
    return found


def _raise(found: list[ErrorDetail]) -> None:
    if found:
        status = 413 if any(d.type == "too_large" for d in found) else 422
        raise RequestRejected(status, found)


def check_one(request: ExecuteRequest, settings: Settings, tenant: Tenant = DEFAULT) -> None:
    _raise(problems(request, settings, ["body"], tenant))


def check_size(
    size: int, settings: Settings, tenant: Tenant = DEFAULT, loc: list[str | int] | None = None
) -> None:
    """Refuse (422, naming the limit) a batch of ``size`` over the server's or the tenant's
    ``max_batch``: every front refuses it whole, none splits it around the quota."""
    limit, where = _limit(settings.max_batch, tenant.max_batch, tenant, "max_batch")
    if size > limit:
        _raise([ErrorDetail(
            loc=loc or ["body", "requests"],
            msg=f"batch of {size} requests; at most {limit:g} per batch {where}",
            type="too_long",
            ctx={"limit": int(limit), "size": size},
        )])  # fmt: skip


def check_batch(
    requests: Sequence[ExecuteRequest], settings: Settings, tenant: Tenant = DEFAULT
) -> None:
    check_size(len(requests), settings, tenant)
    found: list[ErrorDetail] = []
    for i, request in enumerate(requests):
        found.extend(problems(request, settings, ["body", "requests", i], tenant))
    _raise(found)
