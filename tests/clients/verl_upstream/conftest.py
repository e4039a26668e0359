"""verl's own test file, run against the service the package starts (SANDBOX_FUSION_URL)."""

from __future__ import annotations

import pytest

from sandbox_service.service_process import ServiceProcess

# The cases that cannot fit this suite's time, each with why.
TOO_LONG = {
    "test_integration_concurrency_high_load": (
        "100 programs, 4 of them run to a 15 s time limit: over 30 s on this suite's 2 slots"
    ),
    "test_integration_concurrency_all_timeout": (
        "100 programs each run to a 10 s time limit: about 500 s on this suite's 2 slots"
    ),
}


@pytest.fixture(autouse=True)
def _served(clients_service: ServiceProcess) -> None:
    """Every case of the upstream file runs with the service up."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip the cases that cannot fit, saying why."""
    why = TOO_LONG.get(item.name)
    if why is not None:
        pytest.skip(why)
