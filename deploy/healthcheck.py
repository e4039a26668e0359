"""Container health check: healthy when the service answers ``GET /readyz`` with 200 on its
port: its slots passed their canary execution and its queue takes work (``/healthz`` only
says the process is alive; a node that can run nothing must not be called healthy).

An embedded or API node answers on ``SANDBOX_PORT`` (8000), a worker on
``SANDBOX_WORKER_METRICS_PORT`` (9100); the first that answers 200 decides, so one image-level
HEALTHCHECK serves every role. Standard library only: it runs in the service's image.

``healthcheck.py /healthz`` asks the liveness path instead (the manifests' liveness probes:
an exec of this file needs nothing the image lacks, where an engine runs probes inside the
container).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 2.0


def ports(env: dict[str, str]) -> list[int]:
    """Where to look, in order: the API port, then the worker's metrics port."""
    found = []
    for name, default in (("SANDBOX_PORT", "8000"), ("SANDBOX_WORKER_METRICS_PORT", "9100")):
        port = int(env.get(name) or default)
        if port not in found:
            found.append(port)
    return found


def healthy(port: int, path: str = "/readyz") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=TIMEOUT_S) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    path = argv[0] if argv else "/readyz"
    return 0 if any(healthy(port, path) for port in ports(dict(os.environ))) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
