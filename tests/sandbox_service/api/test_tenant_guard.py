"""Tenants cannot hurt each other through the API process: each has its own session store
and limit (one opening sessions by the thousand forgets only its own), failed
authentications never lock out a valid key from the same address, and a worker that Redis
refuses says so in its /readyz."""

from __future__ import annotations

import base64
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandbox_service.service_process import RedisServer, ServiceProcess, launch, start
from sandbox_service.tenants import Tenant, append_key

SESSION_MAX = 4
OWN_MAX = 2
FAILURES = 3


@dataclass
class Keys:
    path: str
    a: str  # no max_sessions: session_max
    b: str
    small: str  # max_sessions OWN_MAX


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    path = str(tmp_path_factory.mktemp("keys") / "keys")
    a, _ = append_key(path, Tenant("a"))
    b, _ = append_key(path, Tenant("b"))
    small, _ = append_key(path, Tenant("small", max_sessions=OWN_MAX))
    return Keys(path, a, b, small)


@pytest.fixture(scope="module")
def service(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("tenants") / "service.log"
    with launch(
        str(log),
        slots=1,
        preload="",
        api_keys_file=keys.path,
        session_max=SESSION_MAX,
        auth_max_failures=FAILURES,
        auth_failure_window_s=600,
    ) as svc:
        yield svc


def _run(service: ServiceProcess, key: str, code: str, session: str) -> httpx.Response:
    return httpx.post(
        service.url + "/v1/execute",
        json={"code": code, "session_id": session},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _has(service: ServiceProcess, key: str, session: str) -> bool:
    headers = {"Authorization": f"Bearer {key}"}
    response = httpx.get(f"{service.url}/v1/sessions/{session}", headers=headers, timeout=30)
    return response.status_code == 200


@pytest.mark.parametrize("flood", ["a", "small"])
def test_a_tenant_cannot_evict_another_tenants_sessions(
    service: ServiceProcess, keys: Keys, flood: str
) -> None:
    assert _run(service, keys.b, "x = 41", f"b-{flood}").json()["status"] == "ok"
    flooder = getattr(keys, flood)
    for i in range(2 * SESSION_MAX):
        assert _run(service, flooder, "1", f"{flood}-{i}").json()["status"] == "ok"
    answer = _run(service, keys.b, "print(x + 1)", f"b-{flood}").json()
    assert answer["stdout"] == "42\n", answer


@pytest.mark.parametrize(("key", "limit"), [("a", SESSION_MAX), ("small", OWN_MAX)])
def test_a_tenant_keeps_its_own_limit_of_sessions(
    service: ServiceProcess, keys: Keys, key: str, limit: int
) -> None:
    secret = getattr(keys, key)
    names = [f"own-{key}-{i}" for i in range(limit + 1)]
    for name in names:
        assert _run(service, secret, "1", name).json()["status"] == "ok"
    assert [_has(service, secret, n) for n in names] == [False] + [True] * limit


BAD = {
    "unknown key": {"Authorization": "Bearer sk-not-a-key"},
    "no key": {},
    "malformed": {"Authorization": "Basic !!!"},
}


@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
def test_failures_never_lock_out_a_valid_key(service: ServiceProcess, keys: Keys, bad: str) -> None:
    for _ in range(FAILURES + 2):
        refused = httpx.get(service.url + "/v1/status", headers=BAD[bad], timeout=30)
        assert refused.status_code in (401, 429)
    assert refused.status_code == 429  # the address is limited for failures
    bearer = {"Authorization": f"Bearer {keys.a}"}
    assert httpx.get(service.url + "/v1/status", headers=bearer, timeout=30).status_code == 200
    basic = base64.b64encode(f"b:{keys.b}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}"}
    assert httpx.get(service.url + "/v1/status", headers=headers, timeout=30).status_code == 200


def test_worker_readyz_names_refused_credentials(tmp_path: Path) -> None:
    """And the worker raised its soft descriptor limit to the hard one at start."""
    redis = RedisServer(str(tmp_path), ["--requirepass", "right-password"])
    redis.start()
    password = tmp_path / "password"
    password.write_text("wrong-password\n")
    worker = None
    try:
        worker = start(
            str(tmp_path / "worker.log"),
            command=("worker",),
            python=("prlimit", "--nofile=512:", sys.executable),
            port_setting="worker_metrics_port",
            wait_for="/healthz",
            slots=1,
            preload="",
            redis_url=redis.url,
            redis_password_file=str(password),
        )
        reason = ""
        for _ in range(100):
            answer = httpx.get(f"{worker.url}/readyz", timeout=10)
            reason = answer.json().get("reason", "")
            if "Redis" in reason and "not reached yet" not in reason:  # it tried: the answer
                break
            time.sleep(0.2)
        assert answer.status_code == 503
        assert "refused this node's credentials" in reason, reason
        limits = Path(f"/proc/{worker.process.pid}/limits").read_text()
        [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3] == line.split()[4], line
    finally:
        if worker is not None:
            worker.stop()
        with contextlib.suppress(Exception):
            redis.stop()
