"""Sessions: state across calls by replaying good cells; failures leave no trace; limits."""

from __future__ import annotations

import base64
import concurrent.futures
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from sandbox_service.client import Retry, SandboxClient
from sandbox_service.models import Status
from sandbox_service.service_process import ServiceProcess


@pytest.fixture(scope="module")
def sandbox(compat_service: ServiceProcess) -> Iterator[SandboxClient]:
    with SandboxClient(compat_service.url, retry=Retry(attempts=3, backoff_s=0.05)) as client:
        yield client


def _sid() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def test_state_carries_over_and_repl_shows_it(sandbox: SandboxClient) -> None:
    sid = _sid()
    first = sandbox.execute("import fractions\nx = fractions.Fraction(1, 3)", session_id=sid)
    assert first.status is Status.ok
    sandbox.execute("def twice(v):\n    return 2 * v", session_id=sid)
    result = sandbox.execute("twice(x)", session_id=sid, mode="repl")
    assert (result.status, result.stdout, result.stderr) == (Status.ok, "Fraction(2, 3)\n", "")


def test_earlier_output_is_not_repeated_and_stdin_is_replayed(sandbox: SandboxClient) -> None:
    sid = _sid()
    first = sandbox.execute("name = input()\nprint('hello', name)", stdin="ada\n", session_id=sid)
    assert first.stdout == "hello ada\n"
    second = sandbox.execute("print(name, input())", stdin="second\n", session_id=sid)
    assert (second.stdout, second.stderr) == ("ada second\n", "")


def test_a_failed_cell_leaves_no_trace(sandbox: SandboxClient) -> None:
    sid = _sid()
    sandbox.execute("total = 1", session_id=sid)
    failed = sandbox.execute("total = 100\nraise ValueError('no')", session_id=sid)
    assert failed.status is Status.error and failed.stderr.endswith("ValueError: no\n")
    timed_out = sandbox.execute("total = 200\nwhile True: pass", session_id=sid, timeout_s=0.5)
    assert timed_out.status is Status.timeout
    assert sandbox.execute("print(total)", session_id=sid).stdout == "1\n"


def test_replayed_history_draws_the_same_random_numbers(sandbox: SandboxClient) -> None:
    sid = _sid()
    code = "import random, numpy\na = random.random()\nb = numpy.random.rand()\nprint(a, b)"
    drawn = sandbox.execute(code, session_id=sid).stdout
    assert sandbox.execute("print(a, b)", session_id=sid).stdout == drawn
    # the replay leaves the generator where the history left it: the sequence goes on
    following = sandbox.execute("print(random.random())", session_id=sid).stdout
    assert following != sandbox.execute("print(random.random())", session_id=sid).stdout


def test_files_of_earlier_calls_and_files_they_wrote(sandbox: SandboxClient) -> None:
    sid = _sid()
    data = base64.b64encode(b"given").decode()
    sandbox.execute("open('made.txt', 'w').write('made')", session_id=sid,
                    files={"given.txt": data})  # fmt: skip
    result = sandbox.execute("print(open('given.txt').read(), open('made.txt').read())",
                             session_id=sid)  # fmt: skip
    assert result.stdout == "given made\n"


def test_batches_keep_order_per_session(compat_service: ServiceProcess) -> None:
    a, b = _sid(), _sid()
    batch = {"requests": [
        {"code": "n = 1", "session_id": a},
        {"code": "print('plain')"},
        {"code": "n = 10", "session_id": b},
        {"code": "n += 1\nprint(n)", "session_id": a},
        {"code": "n += 1\nprint(n)", "session_id": b},
        {"code": "print(n)", "session_id": a},
    ]}  # fmt: skip
    results = httpx.post(f"{compat_service.url}/v1/execute/batch", json=batch, timeout=60).json()
    assert [r["stdout"] for r in results["results"]] == ["", "plain\n", "", "2\n", "11\n", "2\n"]


def test_concurrent_calls_on_one_session_run_one_at_a_time(sandbox: SandboxClient) -> None:
    sid = _sid()
    sandbox.execute("hits = []", session_id=sid)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda i: sandbox.execute(f"hits.append({i})", session_id=sid), range(2)))
    assert sandbox.execute("print(sorted(hits))", session_id=sid).stdout == "[0, 1]\n"


def test_a_resent_request_id_is_applied_once(sandbox: SandboxClient) -> None:
    sid, key = _sid(), f"req-{uuid.uuid4().hex}"
    sandbox.execute("n = 0", session_id=sid)
    first = sandbox.execute("n += 1\nprint(n)", session_id=sid, id=key)
    again = sandbox.execute("n += 1\nprint(n)", session_id=sid, id=key)
    assert first.stdout == again.stdout == "1\n"
    assert sandbox.execute("print(n)", session_id=sid).stdout == "1\n"


def test_cell_cap_is_a_422_naming_the_session(compat_service: ServiceProcess,
                                              sandbox: SandboxClient) -> None:  # fmt: skip
    sid = _sid()
    for i in range(4):  # session_max_cells=4 in this service
        sandbox.execute(f"v{i} = {i}", session_id=sid)
    body = {"code": "print(v3)", "session_id": sid}
    response = httpx.post(f"{compat_service.url}/v1/execute", json=body, timeout=30)
    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "session_id"] and "holds 4 cells" in detail["msg"]
    assert "SANDBOX_SESSION_MAX_CELLS" in detail["msg"]


def test_history_that_no_longer_replays_ends_the_session(sandbox: SandboxClient) -> None:
    sid = _sid()
    deadline = time.time() + 1.0
    timed = sandbox.execute(f"import time\nassert time.time() < {deadline}", session_id=sid)
    assert timed.status is Status.ok
    time.sleep(max(0.0, deadline - time.time()) + 0.1)
    broken = sandbox.execute("print('never')", session_id=sid)
    assert broken.status is Status.error and broken.stdout == ""
    assert "could not be restored" in broken.message and "AssertionError" in broken.message
    fresh = sandbox.execute("print('time' in dir())", session_id=sid)
    assert fresh.stdout == "False\n"


def test_info_end_and_expiry(compat_service: ServiceProcess, sandbox: SandboxClient) -> None:
    url = compat_service.url
    sid = _sid()
    sandbox.execute("kept = 1", session_id=sid, files={"f": base64.b64encode(b"1").decode()})
    info = httpx.get(f"{url}/v1/sessions/{sid}").json()
    assert (info["cells"], info["files"]) == (1, ["f"]) and 0 < info["expires_in_s"] <= 3
    assert httpx.delete(f"{url}/v1/sessions/{sid}").status_code == 204
    assert httpx.get(f"{url}/v1/sessions/{sid}").status_code == 404
    assert httpx.delete(f"{url}/v1/sessions/{sid}").status_code == 404
    other = _sid()
    sandbox.execute("kept = 2", session_id=other)
    time.sleep(3.2)  # session_ttl_s=3 in this service
    assert httpx.get(f"{url}/v1/sessions/{other}").status_code == 404
    gone = sandbox.execute("print(kept)", session_id=other)
    assert gone.status is Status.error and "NameError" in gone.stderr
