"""One real service for the trainers' own client code, where their defaults look for it."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pylatexenc
import pytest

from sandbox_service.service_process import ServiceProcess, free_port, start
from tests.clients.loading import RELEASE

# rStar2-Agent's reward manager calls localhost:8088, hard-coded; any port serves the rest.
REWARD_PORT = 8088


def _free(port: int) -> bool:
    """Whether ``port`` can be bound on loopback now, as the service binds it (a connection
    of an earlier run left in TIME_WAIT does not stop it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


PORT = REWARD_PORT if _free(REWARD_PORT) else free_port()
# verl's upstream test file reads this at import, before any fixture runs.
os.environ["SANDBOX_FUSION_URL"] = f"http://127.0.0.1:{PORT}/run_code"


@pytest.fixture(scope="package")
def clients_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """Set up as docs/integrations.md says for rStar2-Agent: the release's
    ``fused_compute_score/`` and pylatexenc (which it imports) in a package directory, named
    by python_path, the scorer preloaded."""
    packages = tmp_path_factory.mktemp("sandbox-packages")
    shutil.copytree(RELEASE / "fused_compute_score", packages / "fused_compute_score")
    shutil.copytree(Path(pylatexenc.__file__).parent, packages / "pylatexenc")
    log = tmp_path_factory.mktemp("clients") / "service.log"
    svc = start(
        str(log),
        port=PORT,
        slots=2,
        max_timeout_s=30,
        python_path=str(packages),
        preload="numpy,sympy,math_verify,fused_compute_score",
    )
    yield svc
    svc.stop()
