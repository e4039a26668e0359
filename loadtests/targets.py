"""Targets the load generator drives: a service over its native HTTP API or code-judge's, or
the naive baseline.

A target takes a batch of items and answers a ``Reply``: one result dict per item, in order,
and when the request that got them went out on the wire; or it raises ``NoAnswer`` when it
cannot get one (the items are then counted lost). A refusal with a status
code (422, 413, 500) is an answer: each item gets the status ``http_<code>``, which no workload
counts as correct. 429 and 503 are retried, honouring Retry-After, and so are connections
refused before the request went out; nothing that may have reached the service is resent.

- ``HttpTarget``: ``POST /v1/execute`` for batches of one, ``POST /v1/execute/batch`` otherwise.
  Connections are spread over httpx clients of at most ``CONNECTIONS_PER_CLIENT`` each: one
  client's pool scans all its connections and waiters on every request, which at 100
  connections cost ~7 ms of client CPU per request against ~1 ms at 10 (measured here).
- ``CodeJudgeTarget``: code-judge's ``POST /run/long-batch`` (what the rStar2-Agent release
  sends), to code-judge itself or to this service's code-judge front.
- ``NaiveTarget``: ``subprocess.run([python, "-c", code])`` per call on a thread pool, what a
  service without warm interpreters does. Unconfined: it refuses workloads that would harm the
  host.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from loadtests.workloads import Item

CONNECTIONS_PER_CLIENT = 10
JSON = {"content-type": "application/json"}
RETRIED = (429, 503)


class NoAnswer(Exception):
    """The target gave no answer for a batch; ``reason`` says what happened instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Reply:
    results: list[dict[str, Any]]
    # time.monotonic() when the answered request's headers were written: before it, the batch
    # waited for a connection (or for one to be opened) and for 429/503 retries.
    on_wire: float | None = None


class Target(Protocol):
    label: str
    retries: Counter[str]

    async def open(self, lanes: int) -> None: ...

    async def send(self, items: list[Item], lane: int, give_up_at: float) -> Reply:
        """One result dict per item, in order; raises NoAnswer. ``give_up_at`` is a
        ``time.monotonic()`` past which no retry is started."""
        ...

    async def close(self) -> None: ...


def backoff(attempt: int, retry_after: str | None) -> float:
    if retry_after is not None:
        try:
            return max(0.0, float(retry_after)) * (1 + random.random() / 4)
        except ValueError:
            pass
    return min(0.05 * 2**attempt, 5.0) * (0.5 + random.random() / 2)


def _refused(response: httpx.Response, count: int) -> list[dict[str, Any]]:
    message = response.text[:500]
    return [{"status": f"http_{response.status_code}", "message": message}] * count


class HttpTarget:
    """``url``: one service, or several API nodes of one deployment separated by commas, over
    which the lanes are spread evenly; a retry goes to the next node. ``resend``: a batch
    whose every request has an ``id`` is sent again (to the next node) when its connection
    broke after the request went out, which the service's idempotency makes safe: the fault
    soak kills API nodes under load and expects every request answered."""

    def __init__(
        self, url: str, label: str = "service", timeout_s: float = 900.0, resend: bool = False
    ) -> None:
        self.resend = resend
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not self.urls:
            raise ValueError(f"no URL in {url!r}")
        self.label = label
        self.timeout = httpx.Timeout(timeout_s, connect=60.0, pool=None)
        self.retries: Counter[str] = Counter()
        self._clients: list[httpx.AsyncClient] = []

    async def open(self, lanes: int) -> None:
        per = min(lanes, CONNECTIONS_PER_CLIENT)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        nodes = len(self.urls)
        count = -(-max(-(-lanes // per), nodes) // nodes) * nodes  # a multiple of the nodes
        tls = ssl.create_default_context()  # one for all clients: each costs time and memory
        self._clients = [
            httpx.AsyncClient(base_url=self.urls[i % len(self.urls)], timeout=self.timeout,
                              limits=limits, verify=tls)
            for i in range(count)
        ]  # fmt: skip

    async def close(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients))
        self._clients = []

    def request(self, items: list[Item]) -> tuple[str, bytes]:
        """The path and body that carry ``items``."""
        if len(items) == 1:
            return "/v1/execute", orjson.dumps(items[0].request)
        return "/v1/execute/batch", orjson.dumps({"requests": [i.request for i in items]})

    async def send(self, items: list[Item], lane: int, give_up_at: float) -> Reply:
        path, body = self.request(items)
        on_wire: list[float] = []

        async def trace(event: str, _: object) -> None:
            if event == "http11.send_request_headers.started":
                on_wire.append(time.monotonic())

        resendable = self.resend and all("id" in i.request for i in items)
        attempt = 0
        while True:
            # Round robin: each client holds at most ``per`` lanes, and lanes spread over the
            # nodes; each retry goes to the next node.
            client = self._clients[(lane + attempt) % len(self._clients)]
            retry_after = None
            try:
                response = await client.post(
                    path, content=body, headers=JSON, extensions={"trace": trace}
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                cause = "connect"  # nothing was sent: safe to try again
                last = repr(exc)
            except httpx.HTTPError as exc:
                if not resendable:
                    raise NoAnswer(f"{type(exc).__name__}") from exc
                # The same ids again: answered once, whichever node asks. A timeout is
                # counted apart: a service that never answers is a finding, not a fault.
                cause = "timeout" if isinstance(exc, httpx.TimeoutException) else "resend"
                last = repr(exc)
            else:
                if response.status_code not in RETRIED:
                    return Reply(self._results(response, len(items)), on_wire[-1])
                cause = f"http_{response.status_code}"
                last = response.text[:200]
                retry_after = response.headers.get("retry-after")
            self.retries[cause] += 1
            delay = backoff(attempt, retry_after)
            if time.monotonic() + delay > give_up_at:
                raise NoAnswer(f"{cause} until the run stopped ({last})")
            await asyncio.sleep(delay)
            attempt += 1

    def _results(self, response: httpx.Response, count: int) -> list[dict[str, Any]]:
        if response.status_code != 200:
            return _refused(response, count)
        try:
            data = orjson.loads(response.content)
            results = self.results_of(data, count)
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise NoAnswer(f"unreadable answer: {exc!r}") from exc
        if len(results) != count:
            raise NoAnswer(f"sent {count} requests, got {len(results)} results")
        return results

    def results_of(self, data: Any, count: int) -> list[dict[str, Any]]:
        """The native result dicts in an answer's body."""
        return [data] if count == 1 and "status" in data else list(data["results"])


# A code-judge result's ``reason`` -> the native status it stands for, when it did not run
# successfully; any other reason (``""``) is a program that ran and failed.
CODEJUDGE_REASONS = {
    "worker_timeout": "timeout",
    "queue_timeout": "queue_timeout",
    "internal_error": "internal_error",
    "invalid_input": "http_invalid_input",
}


class CodeJudgeTarget(HttpTarget):
    """code-judge's ``POST /run/long-batch``, the one request the rStar2-Agent release sends
    (``rstar2_agent/tools/code_judge_utils.py``): ``{"type": "batch", "submissions": [{"type":
    "python", "solution": code, "input": stdin}, ...]}``, for batches of one too. Speaks to
    code-judge itself or to this service's code-judge front, so one client, payload and batch
    shape measure both. Answers are read back into the native shape: ``run_success`` is
    ``ok``, reasons map by ``CODEJUDGE_REASONS``, else ``error`` (code-judge cannot tell a
    memory or output limit from an error); ``cost`` is the run time. Time and memory limits
    are the server's: a request's ``timeout_s`` and ``memory_mb`` are not sent (code-judge has
    no such fields); a ``repl`` request is wrapped as the naive baseline wraps it; one with
    ``files`` is refused before sending."""

    def __init__(self, url: str, label: str = "code-judge API", timeout_s: float = 900.0) -> None:
        super().__init__(url, label, timeout_s)

    def request(self, items: list[Item]) -> tuple[str, bytes]:
        subs = [submission(item.request) for item in items]
        return "/run/long-batch", orjson.dumps({"type": "batch", "submissions": subs})

    def results_of(self, data: Any, count: int) -> list[dict[str, Any]]:
        return [native_of_codejudge(r) for r in data["results"]]


def submission(request: dict[str, Any]) -> dict[str, Any]:
    """A native request as a code-judge submission."""
    if request.get("files"):
        raise ValueError("code-judge has no files field: a request with files cannot be sent")
    code = request["code"]
    if request.get("mode") == "repl":
        code = REPL.format(source=code)
    return {"type": "python", "solution": code, "input": request.get("stdin", "")}


def native_of_codejudge(result: dict[str, Any]) -> dict[str, Any]:
    reason = result.get("reason") or ""
    status = "ok" if result.get("run_success") else CODEJUDGE_REASONS.get(reason, "error")
    return {
        "status": status,
        "stdout": result.get("stdout") or "",
        "stderr": result.get("stderr") or "",
        "wall_time_s": float(result.get("cost") or 0.0),
        "message": reason,
    }


# A repl-mode request run by a bare interpreter: run the body, print the final expression's repr.
REPL = """import ast
_tree = ast.parse({source!r})
_last = _tree.body.pop() if _tree.body and isinstance(_tree.body[-1], ast.Expr) else None
exec(compile(_tree, "<string>", "exec"))
if _last is not None:
    _value = eval(compile(ast.Expression(_last.value), "<string>", "eval"))
    if _value is not None:
        print(repr(_value))
"""


def write_files(cwd: str, files: dict[str, str]) -> None:
    for path, data in files.items():
        full = os.path.join(cwd, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(base64.b64decode(data))


def interpret(request: dict[str, Any], cwd: str, python: str) -> tuple[str, str, str, int | None]:
    """status, stdout, stderr and exit code of one fresh interpreter running the request."""
    code = request["code"]
    if request.get("mode") == "repl":
        code = REPL.format(source=code)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [python, "-c", code],
            input=request.get("stdin", ""),
            capture_output=True,
            text=True,
            timeout=request.get("timeout_s", 10.0),
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return "timeout", out, "", None
    status = "ok" if done.returncode == 0 else "error"
    if status == "error" and done.stderr.rstrip().endswith("MemoryError"):
        status = "memory_limit"
    return status, done.stdout, done.stderr, done.returncode


def spawn(
    request: dict[str, Any], submitted: float, python: str = sys.executable
) -> dict[str, Any]:
    """Run one request in a fresh interpreter; the result has the native shape."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="naive-") as cwd:
        write_files(cwd, request.get("files", {}))
        status, stdout, stderr, exit_code = interpret(request, cwd, python)
    return {
        "status": status,
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "queue_time_s": started - submitted,
        "wall_time_s": time.time() - started,
        "worker": "naive",
    }


class NaiveTarget:
    """Spawn-per-call with ``parallel`` interpreters at once (default: one per CPU)."""

    def __init__(self, parallel: int | None = None, label: str = "naive") -> None:
        self.parallel = parallel or os.cpu_count() or 1
        self.label = label
        self.retries: Counter[str] = Counter()
        self._pool: ThreadPoolExecutor | None = None

    async def open(self, lanes: int) -> None:
        self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="naive")

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def send(self, items: list[Item], lane: int, give_up_at: float) -> Reply:
        loop = asyncio.get_running_loop()
        now = time.time()
        calls = [loop.run_in_executor(self._pool, spawn, item.request, now) for item in items]
        return Reply(list(await asyncio.gather(*calls)))
