"""What the compatibility fronts share: one table from native statuses to their words, and
native requests built from their fields, checked against this server's limits.

A front only translates (go-judge's transports do the same): its request becomes
``ExecuteRequest``s, the native results come back through ``OUTCOMES``. Every native status
has a row, so no front can meet a status it does not know how to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from sandbox_service.api import policy
from sandbox_service.models import ExecuteRequest, ExecuteResult, Status
from sandbox_service.settings import Settings
from sandbox_service.tenants import Tenant

FusionRunStatus = Literal["Finished", "Error", "TimeLimitExceeded"]


@dataclass(frozen=True)
class Reading:
    """How one native status reads in each front.

    ``ran``: the program ran (to its end or to one of its limits); otherwise it never started,
    or the sandbox failed, and there is no program output to report. ``fusion``: SandboxFusion's
    ``CommandRunStatus``. ``judge``: code-judge's ``reason``.
    """

    ran: bool
    fusion: FusionRunStatus
    judge: str


OUTCOMES: dict[Status, Reading] = {
    Status.ok: Reading(True, "Finished", ""),
    Status.error: Reading(True, "Finished", ""),
    # The compile failed: the submission's fault. SandboxFusion says it in compile_result.
    Status.compile_error: Reading(True, "Finished", ""),
    Status.timeout: Reading(True, "TimeLimitExceeded", "worker_timeout"),
    Status.memory_limit: Reading(True, "Finished", ""),
    Status.output_limit: Reading(True, "Finished", ""),
    Status.killed: Reading(True, "Finished", ""),
    # Never ran: code-judge clients resend queue_timeout items, which is what these want.
    Status.queue_timeout: Reading(False, "Error", "queue_timeout"),
    Status.rejected: Reading(False, "Error", "queue_timeout"),
    Status.internal_error: Reading(False, "Error", "internal_error"),
}


def return_code(result: ExecuteResult) -> int | None:
    """The exit status as ``subprocess`` reports it: negative for a signal."""
    if result.exit_code is not None:
        return result.exit_code
    return -result.signal if result.signal is not None else None


class Refused(Exception):
    """This server will not run the item; the message says why in the front's field names."""


def _name(loc: Any, names: dict[str, str]) -> str:
    field = str(loc[0]) if loc else ""
    return names.get(field, field)


def native_request(
    settings: Settings, names: dict[str, str], tenant: Tenant, **fields: Any
) -> ExecuteRequest:
    """An ExecuteRequest the policy accepts, or ``Refused``; ``names`` maps native field names
    to the front's, for the message."""
    try:
        request = ExecuteRequest(**fields)
    except ValidationError as exc:
        raise Refused(
            "; ".join(
                f"{_name(e['loc'], names)}: {e['msg']}" for e in exc.errors(include_url=False)
            )
        ) from None
    found = policy.problems(request, settings, [], tenant)
    if found:
        raise Refused("; ".join(f"{_name(d.loc, names)}: {d.msg}" for d in found))
    return request
