"""The API stays responsive under any allowed request: bodies of many tiny values are refused
before parsing, connections that do not send a whole request in time are closed, open
connections are capped (the idlest make room), and the descriptor limit is raised at start."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_service.service_process import ServiceProcess, launch

VALUES = 1024  # the service's max_body_values (its lowest allowed)
READ_TIMEOUT_S = 1.0
CAP = 8


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("guard") / "service.log"
    # A low soft descriptor limit (hard unchanged), which the service must raise.
    prlimit = ("prlimit", "--nofile=512:", sys.executable)
    with launch(
        str(log),
        python=prlimit,
        slots=1,
        preload="",
        max_body_values=VALUES,
        http_read_timeout_s=READ_TIMEOUT_S,
        max_connections=CAP,
    ) as svc:
        yield svc


def _body(items: str, count: int) -> bytes:
    return b'{"code": "print(1)", "x": [' + ",".join([items] * count).encode() + b"]}"


@pytest.mark.parametrize(
    "raw",
    [
        _body("[]", 2 * VALUES),
        _body("{}", 2 * VALUES),
        _body("1", 2 * VALUES),
        _body('"s"', 2 * VALUES),
        _body('{"a": [1, 2]}', VALUES),
        b'{"code": "print(1)", "x": ' + b"[" * (2 * VALUES) + b"]" * (2 * VALUES) + b"}",
    ],
    ids=["lists", "objects", "numbers", "strings", "nested", "deep"],
)
def test_many_values_refused_before_parsing(guarded: ServiceProcess, raw: bytes) -> None:
    for path in ("/v1/execute", "/v1/execute/batch", "/run_code"):
        response = httpx.post(guarded.url + path, content=raw, timeout=60)
        assert response.status_code == 413, response.text
        assert str(VALUES) in response.json()["detail"]


def test_punctuation_inside_strings_is_not_counted(guarded: ServiceProcess) -> None:
    code = 'x = [1, 2, {"a": [3, 4]}]\n' * 200 + "print(len(x), '\\\\', \"[,{:\")"
    assert sum(code.count(c) for c in "[{,:") > VALUES
    response = httpx.post(guarded.url + "/v1/execute", json={"code": code}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["stdout"] == "3 \\ [,{:\n"


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``sock`` (EOF or reset) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


HEAD = b"POST /v1/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/exe", HEAD, HEAD + b"Content-Length: 100\r\n\r\n" + b'{"code": "pri'],
    ids=["nothing", "half a request line", "half a head", "half a body"],
)
def test_slow_connections_are_closed(guarded: ServiceProcess, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(sent)
        assert _closed_within(sock, 20 * READ_TIMEOUT_S + 10)


def test_idle_after_a_response_then_half_a_head_is_closed(guarded: ServiceProcess) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in sock.recv(65536)
        sock.sendall(b"GET /heal")
        assert _closed_within(sock, 20 * READ_TIMEOUT_S + 10)


def test_a_request_running_longer_than_the_read_timeout_is_answered(
    guarded: ServiceProcess,
) -> None:
    code = f"import time; time.sleep({3 * READ_TIMEOUT_S}); print('late')"
    response = httpx.post(guarded.url + "/v1/execute", json={"code": code}, timeout=60)
    assert response.json()["stdout"] == "late\n"


def test_past_the_cap_the_idlest_connection_makes_room(guarded: ServiceProcess) -> None:
    idle = [socket.create_connection(("127.0.0.1", guarded.port)) for _ in range(CAP)]
    try:
        time.sleep(0.2)  # all accepted, the first idle longest
        response = httpx.get(guarded.url + "/healthz", timeout=30)
        assert response.status_code == 200
        assert _closed_within(idle[0], 0.5 * READ_TIMEOUT_S)  # before its read timeout
    finally:
        for sock in idle:
            sock.close()


def test_descriptor_limit_raised_to_hard(guarded: ServiceProcess) -> None:
    limits = Path(f"/proc/{guarded.process.pid}/limits").read_text()
    [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    assert soft == hard, line
    json.dumps(soft)


def test_pipelined_requests_are_all_answered(guarded: ServiceProcess) -> None:
    body = b'{"code": "import time; time.sleep(1.5); print(7)"}'
    one = HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(one * 3 + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(60)
        received = b""
        while received.count(b"HTTP/1.1 200") < 4:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b'"stdout":"7\\n"') == 3
