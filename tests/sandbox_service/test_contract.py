"""The executor's vocabulary and the API's agree: one Mode, and Status is RunStatus plus what
only the service decides."""

from __future__ import annotations

from sandbox_service.executor import protocol
from sandbox_service.models import SERVICE_ONLY, Mode, Status


def test_status_is_the_executors_and_the_services_own() -> None:
    executor = {s.value for s in protocol.RunStatus}
    assert {s.value for s in Status} == executor | set(SERVICE_ONLY)
    assert not executor & set(SERVICE_ONLY)


def test_one_mode() -> None:
    assert Mode is protocol.Mode


def test_run_spec_travels_with_its_limits() -> None:
    limits = protocol.Limits(timeout_s=2.5, memory_mb=64, address_space=False)
    spec = protocol.RunSpec(code="x", limits=limits, argv=["./main"], language="cpp",
                            source="main.cpp", executables=["main"], collect=["*.class"])  # fmt: skip
    frame = spec.frame()
    back = protocol.RunSpec.from_frame({k: v for k, v in frame.items() if k != "op"})
    assert back == spec
    assert not back.in_process
    assert protocol.RunSpec(code="x", limits=limits).in_process
