"""A floor process: forks one child per execution, which runs the code with stdout to a pipe.

Nothing else is on an execution's path: no isolation, no framing, no queue, no JSON. The
parent forks, reads the pipe to its end, waits; the child execs the code in a fresh
``__main__`` dict, flushes and ``_exit``s. What the benchmark calls the floor: the fastest a
slot could go on this machine with the same interpreter and the same address space to fork.

Run as ``python -m loadtests.floor_process TOKENS_FD`` by ``loadtests.floor``, which sends
its configuration first. Start-up: with a ``preload`` list, import and warm it with the
zygote's own ``preload``, then collect, freeze and collapse the heap into huge pages as the
zygote does; without one, nothing: a bare CPython (beyond what ``python -c`` holds, only
``runpy``, this package and the built-in ``gc``; messages are ``marshal``, not JSON, which
would bring more).
Then, per command: run ``warm`` executions, say so, and, if ``active``, run one execution per
``g`` byte read from the token pipe that all floor processes share, until an ``s`` byte; report
the latencies. One byte read from a shared pipe is the only coordination between them.
"""

# No ``from __future__ import annotations``: a module to import that nothing here needs.
import gc
import marshal
import os
import sys
import time

READ = 1 << 16
EXAMPLE_BYTES = 300


def run(code: str) -> None:
    """In the child: run ``code``, flush, exit; never returns."""
    status = 0
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<string>", "exec"), namespace)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        status = 1
    os._exit(status)


def execute(code: str) -> tuple[bytes, int]:
    """One execution: (what the child wrote to stdout and stderr, its wait status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.dup2(w, 2)
        run(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, READ):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status


def prepare(modules: list[str], warmup: str) -> dict[str, object]:
    """The zygote's start-up, less its confinement: preload and warm, freeze, huge pages."""
    from sandbox_service.executor import isolation
    from sandbox_service.executor.startup import preload

    failed = preload(modules, warmup)
    gc.collect()
    gc.freeze()
    return {"preload_failed": failed, "huge_pages_mb": isolation.collapse_heap_into_huge_pages()}


def send(fd: int, message: object) -> None:
    """A message on a pipe: its length (4 bytes) and its ``marshal`` form."""
    body = marshal.dumps(message)  # type: ignore[arg-type]  # typing is not imported here
    data = memoryview(len(body).to_bytes(4, "little") + body)
    while data:
        data = data[os.write(fd, data) :]


def _exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def recv(fd: int) -> object | None:
    """The next message on a pipe, None at its end."""
    head = _exactly(fd, 4)
    body = None if head is None else _exactly(fd, int.from_bytes(head, "little"))
    return None if body is None else marshal.loads(body)


def measure(code: str, expected: bytes, tokens: int) -> dict[str, object]:
    latencies: list[float] = []
    wrong, example = 0, ""
    while os.read(tokens, 1) == b"g":
        start = time.monotonic()
        out, status = execute(code)
        latencies.append(time.monotonic() - start)
        if out != expected or status != 0:
            wrong += 1
            example = example or out[-EXAMPLE_BYTES:].decode(errors="replace")
    ended = start + latencies[-1] if latencies else None
    return {"op": "done", "latencies": latencies, "wrong": wrong, "example": example,
            "ended": ended}  # fmt: skip


def main(argv: list[str]) -> None:
    tokens = int(argv[0])
    cfg = recv(0)
    assert isinstance(cfg, dict)
    ready: dict[str, object] = {"op": "ready", "pid": os.getpid()}
    if cfg.get("preload") is not None:
        ready.update(prepare(cfg["preload"], cfg.get("warmup", "")))
    ready["modules"] = sorted(sys.modules)
    send(1, ready)
    while isinstance(cmd := recv(0), dict):
        code, expected = cmd["code"], cmd["expected"].encode()
        for _ in range(cmd["warm"]):
            execute(code)
        send(1, {"op": "warmed"})
        if cmd["active"]:
            send(1, measure(code, expected, tokens))


if __name__ == "__main__":
    main(sys.argv[1:])
