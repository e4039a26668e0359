"""The delaying proxies of ``loadtests.rtt``: what they hold back, what they count, the CLI."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from loadtests.rtt import DelayLinks, Link, Row, parse_args, table


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback server that sends back what it reads."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()
    server.close()


def round_trip_s(port: int, payloads: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        for _ in range(payloads):
            s.sendall(b"ping")
            assert s.recv(16) == b"ping"
        return (time.monotonic() - start) / payloads


@pytest.mark.parametrize("rtt_ms", [0.0, 40.0])
def test_each_round_trip_is_held_for_the_rtt_and_counted(echo: tuple[str, int],
                                                         rtt_ms: float) -> None:  # fmt: skip
    links = DelayLinks([Link("node", echo, True), Link("client", echo, False)], rtt_ms)
    try:
        took = round_trip_s(links.ports[0], 5)
        assert rtt_ms / 1000 <= took < rtt_ms / 1000 + 0.2, took  # held, and not for ever
        round_trip_s(links.ports[1], 3)  # not counted
        assert links.sent() == [5, 0]
    finally:
        links.stop()
    assert not links.process.is_alive()


def test_the_table_names_round_trips_and_ratios() -> None:
    rows = [Row("0", "lone", 10, 100.0, 5.0, 9.0, 2.0, 4.0),
            Row("10", "lone", 10, 20.0, 45.0, 50.0, 2.0, 4.0),
            Row("0", "batches", 10, 400.0, 50.0, 90.0, 0.1, 0.2),
            Row("10", "batches", 10, 360.0, 60.0, 99.0, 0.1, 0.2)]  # fmt: skip
    out = table(rows)
    assert "| 0 | lone | 10 | 100 | 5.0 / 9.0 | 6.00 (2.00 + 4.00) |" in out
    assert "lone at 10 ms: 4.0 RTTs on the path" in out
    assert "batches at 10 ms: 0.90 of 0 ms's exec/s" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--rtt-ms", "fast"], "--rtt-ms: 'fast'"),
    (["--rtt-ms", "-1"], "--rtt-ms: '-1'"),
    (["--count", "0"], "--count and --lone"),
    (["--batch", "0"], "--batch"),
])  # fmt: skip
def test_bad_arguments_are_named(argv: list[str], says: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err
