"""Auth on, against a real service: keys on every route but the probes, refusals that say
nothing of what was wrong, tenants that cannot see each other, quotas, reloads, the clients
that can only send a URL, and the per-front anonymous tenant."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests

from sandbox_service.client import SandboxAuthError, SandboxClient
from sandbox_service.service_process import ServiceProcess, start
from sandbox_service.tenants import Tenant, append_key, key_id, revoke_keys


@dataclass
class Keys:
    path: str
    a: str
    b: str
    admin: str
    revoked: str


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    path = str(tmp_path_factory.mktemp("keys") / "keys")
    a, _ = append_key(path, Tenant("a", max_queued=2, max_timeout_s=5))
    b, _ = append_key(path, Tenant("b"))
    admin, _ = append_key(path, Tenant("ops", admin=True))
    revoked, line = append_key(path, Tenant("gone"))
    append_key(path, Tenant("judge"))
    revoke_keys(path, key_id(line.digest))
    return Keys(path, a, b, admin, revoked)


@pytest.fixture(scope="module")
def service(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("auth") / "service.log"
    svc = start(
        str(log),
        slots=2,
        preload="math",
        api_keys_file=keys.path,
        auth_max_failures=1000,
        codejudge_tenant="judge",
        codejudge_networks="127.0.0.0/8",
    )
    yield svc
    svc.stop()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_every_route_but_the_probes_needs_a_key(service: ServiceProcess, keys: Keys) -> None:
    for path in ("/healthz", "/readyz"):
        assert httpx.get(service.url + path).status_code == 200
    refused = [
        httpx.get(service.url + "/v1/status"),
        httpx.get(service.url + "/openapi.json"),
        httpx.get(service.url + "/docs"),
        httpx.get(service.url + "/no/such/path"),
        httpx.post(service.url + "/v1/execute", json={"code": "print(1)"}),
        httpx.post(service.url + "/run_code", json={"code": "1", "language": "python"}),
        httpx.get(service.url + "/v1/sessions/s"),
        httpx.get(service.url + "/metrics"),
    ]
    assert {r.status_code for r in refused} == {401}
    ok = httpx.post(service.url + "/v1/execute", json={"code": "print(1)"}, headers=_bearer(keys.b))
    assert ok.status_code == 200 and ok.json()["stdout"] == "1\n"


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer sbx_not-a-key", "Token abc", "Basic !!!", "revoked", "almost"],
)
def test_every_bad_key_gets_the_same_401(service: ServiceProcess, keys: Keys, header: str) -> None:
    value = {"revoked": f"Bearer {keys.revoked}", "almost": f"Bearer {keys.a[:-1]}X"}.get(
        header or "", header
    )
    headers = {"Authorization": value} if value else {}
    response = httpx.post(service.url + "/v1/execute", json={"code": "1"}, headers=headers)
    assert response.status_code == 401
    assert response.json() == {"detail": "missing or invalid API key"}
    assert response.headers["www-authenticate"] == 'Bearer realm="sandbox-service"'


def test_tenants_see_neither_each_others_results_nor_sessions(
    service: ServiceProcess, keys: Keys
) -> None:
    def run(key: str, **fields: object) -> dict[str, object]:
        response = httpx.post(service.url + "/v1/execute", json=fields, headers=_bearer(key))
        response.raise_for_status()
        return response.json()

    secret = run(keys.a, code="print('a secret')", id="job-1")
    assert secret["stdout"] == "a secret\n"
    theirs = run(keys.b, code="print('b runs its own')", id="job-1")
    assert theirs["stdout"] == "b runs its own\n"  # a new execution, not a's stored result
    run(keys.a, code="x = 41", session_id="s1")
    mine = run(keys.b, code="print(globals().get('x'))", session_id="s1")
    assert mine["stdout"] == "None\n"
    assert httpx.get(service.url + "/v1/sessions/s1", headers=_bearer(keys.b)).json()["cells"] == 1
    assert httpx.delete(service.url + "/v1/sessions/s1", headers=_bearer(keys.b)).status_code == 204
    assert run(keys.a, code="print(x + 1)", session_id="s1")["stdout"] == "42\n"  # a's is intact


def test_quotas_answer_for_their_tenant_only(service: ServiceProcess, keys: Keys) -> None:
    slow = {"requests": [{"code": "import time; time.sleep(1)"}] * 2}
    with httpx.Client(base_url=service.url, timeout=30) as http:
        over_time = http.post("/v1/execute", json={"code": "1", "timeout_s": 6},
                              headers=_bearer(keys.a))  # fmt: skip
        assert over_time.status_code == 422
        assert "at most 5 for tenant 'a' (its quota max_timeout_s)" in str(over_time.json())
        with httpx.Client(base_url=service.url, timeout=30) as other:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(other.post, "/v1/execute/batch", json=slow,
                                   headers=_bearer(keys.a))  # fmt: skip
                time.sleep(0.5)
                refused = http.post("/v1/execute", json={"code": "1"}, headers=_bearer(keys.a))
                assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
                assert "tenant 'a' is over its quota max_queued" in refused.json()["detail"]
                fine = http.post("/v1/execute", json={"code": "print(2)"}, headers=_bearer(keys.b))
                assert fine.status_code == 200 and fine.json()["stdout"] == "2\n"
                assert held.result().status_code == 200
        metrics = http.get("/metrics", headers=_bearer(keys.admin)).text
        assert 'sandbox_tenant_refused_total{quota="max_queued",tenant="a"} 1.0' in metrics
        assert 'sandbox_tenant_executions_total{status="ok",tenant="b"}' in metrics
        assert 'sandbox_auth_failures_total{reason="invalid"}' in metrics
        assert http.get("/metrics", headers=_bearer(keys.b)).status_code == 403


def test_clients_that_take_only_a_url_send_the_key_in_it(
    service: ServiceProcess, keys: Keys
) -> None:
    """verl posts with requests to sandbox_fusion_url; rStar2-Agent builds
    http://{host_addr}:{host_port}/run/long-batch for aiohttp: credentials in the URL are sent
    as HTTP Basic by both, and accepted here."""
    host = service.url.removeprefix("http://")
    verl_url = f"http://b:{keys.b}@{host}/run_code"
    payload = '{"code": "print(6 * 7)", "language": "python", "run_timeout": 5}'
    answer = requests.post(verl_url, data=payload,
                           headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
    assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == "42\n"

    async def rstar2(host_addr: str, host_port: str) -> tuple[int, object]:
        url = f"http://{host_addr}:{host_port}/run/long-batch"
        body = {"type": "batch", "submissions": [{"type": "python", "solution": "print(3)"}]}
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
            return response.status, await response.json()

    hostname, port = host.split(":")
    status, body = asyncio.run(rstar2(f"b:{keys.b}@{hostname}", port))
    assert status == 200 and body["results"][0]["stdout"] == "3\n"  # type: ignore[index]
    only_user = base64.b64encode(f"{keys.b}:".encode()).decode()
    ok = httpx.post(service.url + "/v1/execute", json={"code": "1"},
                    headers={"Authorization": f"Basic {only_user}"})  # fmt: skip
    assert ok.status_code == 200


def test_a_front_can_let_a_network_in_without_a_key(service: ServiceProcess) -> None:
    judged = httpx.post(service.url + "/run", json={"type": "python", "solution": "print(5)"})
    assert judged.status_code == 200 and judged.json()["stdout"] == "5\n"
    assert httpx.post(service.url + "/v1/execute", json={"code": "1"}).status_code == 401


def test_the_sdk_sends_its_key(service: ServiceProcess, keys: Keys) -> None:
    with SandboxClient(service.url, api_key=keys.b) as client:
        assert client.execute("print(9)").stdout == "9\n"
    with SandboxClient(service.url, api_key="sbx_wrong") as client, pytest.raises(SandboxAuthError):
        client.execute("print(9)")


def test_new_keys_count_on_change_and_on_sighup(service: ServiceProcess, keys: Keys) -> None:
    fresh, _ = append_key(keys.path, Tenant("late"))
    deadline = time.monotonic() + 10
    status = 401
    while status == 401 and time.monotonic() < deadline:
        time.sleep(0.2)
        status = httpx.get(service.url + "/v1/status", headers=_bearer(fresh)).status_code
    assert status == 200
    with open(keys.path, "a") as f:
        f.write("broken line\n")
    os.kill(service.process.pid, signal.SIGHUP)
    time.sleep(0.5)
    assert service.process.poll() is None  # SIGHUP reloads, it does not stop the service
    assert httpx.get(service.url + "/v1/status", headers=_bearer(fresh)).status_code == 200
    assert "API keys not reloaded" in service.log() and f"{keys.path}:7" in service.log()
    lines = Path(keys.path).read_text().splitlines()
    Path(keys.path).write_text("\n".join(lines[:-1]) + "\n")


def test_a_source_that_keeps_failing_is_held_off(keys: Keys, tmp_path: Path) -> None:
    svc = start(str(tmp_path / "log"), slots=1, preload="math", api_keys_file=keys.path,
                auth_max_failures=3, auth_failure_window_s=30)  # fmt: skip
    try:
        codes = [httpx.get(svc.url + "/v1/status", headers=_bearer(f"sbx_guess{i}")).status_code
                 for i in range(4)]  # fmt: skip
        assert codes == [401, 401, 401, 429]
        held = httpx.get(svc.url + "/v1/status", headers=_bearer("sbx_guess5"))
        assert held.status_code == 429 and int(held.headers["retry-after"]) > 20
        # A valid key from the same address is never held off (issue 30).
        assert httpx.get(svc.url + "/v1/status", headers=_bearer(keys.b)).status_code == 200
        assert httpx.get(svc.url + "/healthz").status_code == 200
    finally:
        svc.stop()


def test_a_key_file_that_does_not_parse_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("# keys\nsha256:123 team\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_service.cli", "serve", "--api-keys-file", str(bad),
         "--slots", "1"], capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{bad}:2: the first field must be sha256:" in done.stderr
