"""The program that runs other programs: several cells in one sandboxed interpreter, then files.

This module is not imported by the service; ``cell_program`` sends its source, compiled under
the name ``<driver>``, as the code of an ordinary execution, and the spec (JSON: the cells,
each with its own stdin, a session's history to replay, the files to read back, the nonce) as
that execution's stdin. Inside the confined child it splits in two processes:

- the **judge** (this process) forks the **kernel** before it reads a byte of the spec, then
  makes itself undumpable, reads the spec, and hands the kernel one cell at a time. It alone
  knows the nonce, the cells still to come, and what to report; it decides the exit status;
- the **kernel** runs each cell in one shared ``__main__`` namespace with the executor's own
  compile and exec, forking itself anew before each visible cell (so no thread an earlier
  cell started runs during it), and tells the judge, before anything of the cell's can run
  again (its exception's ``__str__``, a display's ``__repr__``), whether the cell raised. It
  does so with functions it took hold of before the first cell ran, so a cell that replaces
  ``child.run``, ``builtins.exec``, ``os._exit`` or anything else it can name changes nothing
  of how later cells are run and judged; and it never sees the nonce nor a later cell's code.

Why (issue 21, class 6): in one process, a cell could find the driver and its nonce on the
stack and wrap ``child.run`` so that later failing cells (a grader's ``assert``) were answered
ok, and a session replayed the patch on every call. What stays possible is what any code
sharing an interpreter can do to code that runs after it: a child process or an audit hook
an earlier cell left running, or ctypes writing into the interpreter, acts during
later cells (docs/SECURITY.md).

What it reports besides the cells' own output travels on stdout as ``NONCE json NONCE``
events, and after each visible cell a bare ``NONCE`` marks the end of its stderr; the API
splits the streams at the nonce. Only the standard library and the executor are used: this
runs after confinement, where nothing new can be installed.
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import io
import json
import marshal
import os
import signal
import sys
import traceback
import types
from typing import Any


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            return


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()  # type: ignore[union-attr]
        except Exception:  # a stream the cell closed or replaced must not stop the driver
            pass


# ------------------------------------------------------------------ the kernel (cells run here)


def _error_of(exc: BaseException | None, tb: Any, status: int) -> list[dict[str, Any]]:
    """The notebook's ``error`` list for a cell that ended with ``status``."""
    if exc is None:
        if status == 0:
            return []
        return [{"ename": "SystemExit", "evalue": str(status), "traceback": []}]
    lines = traceback.format_exception(type(exc), exc, tb)
    return [{"ename": type(exc).__name__, "evalue": str(exc), "traceback": lines}]


def _seed(seed: int) -> None:
    import random

    random.seed(seed)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed(seed % 2**32)


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


def _describe(cell: dict[str, Any], status: int, raised: BaseException | None,
              shown: list[Any]) -> dict[str, Any]:  # fmt: skip
    """What a notebook shows of a cell (or the error of a replayed one), and the traceback on
    stderr; runs the cell's own ``__repr__`` and ``__str__``, so only once the verdict is sent
    (and the judge checks that an error is there when the verdict says so)."""
    display: list[dict[str, str]] = []
    error: list[dict[str, Any]] = []
    try:
        if isinstance(raised, SystemExit):  # sys.exit("why"): printed, as Python does
            print(raised.code, file=sys.stderr)
            raised = None
        tb = raised.__traceback__ if raised is not None else None
        # The kernel's own frame goes: the traceback starts at the cell's code (a syntax error
        # has none), as for a plain execution.
        tb = None if isinstance(raised, SyntaxError) else tb.tb_next if tb is not None else None
        if raised is not None and not cell["silent"]:
            traceback.print_exception(type(raised), raised, tb)
        for value in shown:
            if value is None:
                continue
            if cell["notebook"]:
                display.append({"text/plain": repr(value)})
            else:
                print(repr(value))
        if cell["notebook"] or cell["silent"]:
            error = _error_of(raised, tb, status)
    except BaseException as exc:  # the cell's own objects failed to show themselves
        error = [{"ename": type(exc).__name__, "evalue": "", "traceback": []}]
    return {"display": display, "error": error}


def _guard(event: str, args: tuple[Any, ...], me: object = None,
           refuse: type[Exception] = RuntimeError) -> None:  # fmt: skip
    """The kernel's audit hook, added before any cell: no cell adds one of its own (issue 30,
    class 1: a hook left by a cell ran at each later cell's ``exec`` event, walked up to this
    kernel's frame and wrote a forged verdict ahead of the real one). CPython drops a hook
    whose addition an earlier hook refuses with a RuntimeError, the C API's
    (``PySys_AddAuditHook`` through ctypes) too. Hooks cannot be removed, and this one cannot be
    given new code or defaults (both are audited); it reads no global a cell could rebind."""
    if event == "sys.addaudithook":
        raise refuse("audit hooks are the sandbox's: a cell cannot add one")
    if event == "object.__setattr__" and args[0] is me:
        raise refuse("the sandbox's audit hook cannot be changed")


# One function on purpose: what runs between a cell and its verdict must be this running
# frame's own code, which no cell can replace (a helper's ``__code__`` could be).
def _kernel(commands: int, reports: int) -> None:  # noqa: C901
    """Run cells as the judge sends them (marshal, length first) until it closes the pipe;
    never returns. Between reading a cell and sending its verdict the loop calls only C
    functions it bound to its own locals before the first cell ran: nothing a cell can rebind
    by name or give new code (a Python function's ``__code__`` can be replaced; a running
    frame's cannot)."""
    import ast
    import linecache
    import marshal

    os.close(0)  # the spec: the judge's alone
    exec_, eval_, compile_, float_, len_, type_, isinstance_, int_ = (
        builtins.exec, builtins.eval, builtins.compile, builtins.float, builtins.len,
        builtins.type, builtins.isinstance, builtins.int)  # fmt: skip
    base_exc, system_exit, timeout_error, repr_ = BaseException, SystemExit, TimeoutError, repr
    expr, expression, only_ast = ast.Expr, ast.Expression, ast.PyCF_ONLY_AST
    read, write, loads, encode, from_bytes, exit_, fork_, getpid_, listdir = (
        os.read, os.write, marshal.loads, str.encode, int.from_bytes, os._exit, os.fork,
        os.getpid, os.listdir)  # fmt: skip
    settrace, setprofile, set_signal, set_timer, alarm, real = (
        sys.settrace, sys.setprofile, signal.signal, signal.setitimer, signal.SIGALRM,
        signal.ITIMER_REAL)  # fmt: skip
    dup, dup2, close, memfd, lseek, seek_set, text_io, file_io = (
        os.dup, os.dup2, os.close, os.memfd_create, os.lseek, os.SEEK_SET, io.TextIOWrapper,
        io.FileIO)  # fmt: skip
    out, err, sys_, cache, devnull, describe = (
        sys.stdout, sys.stderr, sys, linecache.cache, os.open(os.devnull, os.O_WRONLY),
        _describe)  # fmt: skip
    limit = [0.0]
    _guard.__defaults__ = (_guard, RuntimeError)
    sys.addaudithook(_guard)

    def fire(signum: int, frame: object) -> None:
        raise timeout_error(f"cell exceeded its time limit of {limit[0]:g} s")

    namespace = _fresh_main()
    while True:
        # Before reading the next cell: a thread an earlier cell started would run during it
        # (and could read its token); only this thread goes on in a fork of this process, and
        # the judge adopts it. No thread, no fork: the common case costs one listdir.
        if len_(listdir("/proc/self/task")) > 1 and fork_():
            exit_(0)
        size, cell = b"", None
        while len_(size) < 4 and (chunk := read(commands, 4 - len_(size))):
            size += chunk
        if len_(size) < 4:
            break
        data, want = b"", from_bytes(size, "big")
        while len_(data) < want and (chunk := read(commands, want - len_(data))):
            data += chunk
        cell = loads(data)
        if cell.get("seed") is not None:  # before any cell has run
            _seed(int(cell["seed"]))
            continue
        token = cell["token"]  # what marks this cell's reports: stale lines are dropped
        shown: list[Any] = []
        raised: BaseException | None = None
        stdin = memfd("stdin", 0)
        write(stdin, encode(cell["stdin"], "utf-8", "surrogatepass"))
        lseek(stdin, 0, seek_set)
        dup2(stdin, 0)
        close(stdin)
        sys_.stdin = text_io(file_io(0, "r", closefd=False), encoding="utf-8")
        code, mode, silent = cell["code"], cell["mode"], cell["silent"]
        cache["<string>"] = (len_(code), None, code.splitlines(True), "<string>")
        for stream in (out, err):  # the interpreter's own streams: C methods
            try:
                stream.flush()
            except base_exc:
                pass
        saved = (dup(1), dup(2)) if silent else None
        if saved is not None:
            dup2(devnull, 1)
            dup2(devnull, 2)
        limit[0] = float_(cell["timeout"])
        if limit[0] > 0:
            set_signal(alarm, fire)
            set_timer(real, limit[0])
        settrace(None)
        setprofile(None)
        try:
            last = None
            if mode != "repl":
                body = compile_(code, "<string>", "exec")
            else:
                tree = compile_(code, "<string>", "exec", only_ast)
                final = tree.body[-1] if tree.body else None
                if type_(final) is expr:
                    tree.body.pop()
                    last = compile_(expression(final.value), "<string>", "eval")  # type: ignore[union-attr]
                body = compile_(tree, "<string>", "exec")
            exec_(body, namespace)
            if last is not None:
                shown.append(eval_(last, namespace))
            status = 0
        except system_exit as exc:  # its code says how the cell ended, as child._exit_code
            value: Any = exc.code
            status = 0 if value is None else (value & 0xFF if isinstance_(value, int_) else 1)
            raised = None if value is None or isinstance_(value, int_) else exc
        except base_exc as exc:
            status, raised = 1, exc
        settrace(None)
        setprofile(None)
        if limit[0] > 0:
            set_timer(real, 0)
        # The verdict, before the cell's objects speak; one write, so one line.
        write(reports, encode(f"{token} {getpid_()} {status}\n"))
        try:  # the description may run anything (a cell may even have rewritten _describe)
            text = repr_(describe(cell, status, raised, shown))
        except base_exc:
            text = "{}"
        for stream in (sys_.stdout, sys_.stderr, out, err):
            try:
                stream.flush()
            except base_exc:
                pass
        if saved is not None:
            for fd, kept in ((1, saved[0]), (2, saved[1])):
                dup2(kept, fd)
                close(kept)
        pending = encode(f"{token} " + text.replace("\n", " ") + "\n", "utf-8", "surrogatepass")
        while pending:
            pending = pending[write(reports, pending) :]
    exit_(0)


# ------------------------------------------------------------------ the judge


def _fetch(paths: list[str]) -> dict[str, str]:
    files = {}
    for path in paths:
        try:
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    files[path] = base64.b64encode(f.read()).decode()
        except (OSError, MemoryError):
            pass  # as SandboxFusion: what cannot be read is left out
    return files


def _details(line: bytes) -> dict[str, Any]:
    """The kernel's description of a cell (a Python literal), or an empty one: it is written
    after the cell's objects ran, and may be anything."""
    empty: dict[str, Any] = {"display": [], "error": []}
    try:
        found = ast.literal_eval(line.decode("utf-8", "surrogatepass"))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return empty
    if not isinstance(found, dict):
        return empty
    display = [d for d in found.get("display", []) if isinstance(d, dict)]
    error = [e for e in found.get("error", []) if isinstance(e, dict)]
    return {"display": display, "error": error}


def _one_way() -> tuple[int, int]:
    """(read end, write end) of a one-way channel: a socket pair, not a pipe, because a cell can
    open ``/proc/self/fd/N`` of a pipe's read end for writing, and bytes it wrote into the
    commands then stalled the kernel until the call's timeout (a status of the service's); a
    socket cannot be opened that way."""
    import _socket

    read, write = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    read.shutdown(_socket.SHUT_WR)
    write.shutdown(_socket.SHUT_RD)
    return read.detach(), write.detach()


class _Kernel:
    """The judge's end of the kernel: send a cell, read how it ended."""

    def __init__(self) -> None:
        to_kernel, self.commands = _one_way()
        self.reports, from_kernel = _one_way()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.commands)
            os.close(self.reports)
            try:
                _kernel(to_kernel, from_kernel)
            finally:
                os._exit(1)
        os.close(to_kernel)
        os.close(from_kernel)
        self.lines = open(self.reports, "rb", buffering=0)  # noqa: SIM115 (lives as long)

    def send(self, message: dict[str, Any]) -> None:
        data = marshal.dumps(message)
        _write_all(self.commands, len(data).to_bytes(4, "big") + data)

    def _line(self, token: bytes) -> bytes | None:
        """The next report line of the cell marked ``token`` (lines without it were written
        by something else that holds the pipe: dropped); None at its end."""
        while line := self.lines.readline():
            if line.startswith(token + b" "):
                return line[len(token) + 1 :]
        return None

    def run(self, cell: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
        """(status, report); status None if the kernel ended without saying (its own exit)."""
        token = os.urandom(16).hex()  # (not secrets: its import costs ms per execution)
        self.send({**cell, "token": token})
        verdict = (self._line(token.encode()) or b"").split()
        if len(verdict) != 2 or not verdict[0].isdigit() or not verdict[1].lstrip(b"-").isdigit():
            return None, {"display": [], "error": []}
        self.pid = int(verdict[0])  # the kernel that ran it (it forks away from threads)
        return int(verdict[1]), _details(self._line(token.encode()) or b"")

    def finish(self, status: int) -> None:
        """Exit with ``status`` once the kernel has exited and been reaped (and every earlier
        kernel): their peak memory and CPU then count in this process's, which is what the
        zygote measures (``executor/judge.py``)."""
        _flush()
        os.close(self.commands)  # the kernel reads the end, and exits
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # kernels of earlier cells; not what runs on
                pass
        os._exit(status)

    def ended(self) -> int:
        """Wait for the kernel; the status a plain execution would have ended with."""
        _, status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(status):  # end as it did, so that the zygote judges the signal
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            _flush()
            os.kill(os.getpid(), sig)
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _emit(nonce: bytes, event: dict[str, Any]) -> None:
    _write_all(1, nonce + json.dumps(event).encode() + nonce)


def _checked(status: int, report: dict[str, Any]) -> dict[str, Any]:
    """A report that agrees with the verdict: the kernel's description of a cell is written
    after the cell's own objects had their say, so the judge does not take an empty error
    list for a cell that failed."""
    if status != 0 and not report.get("error"):
        why = {"ename": "Error", "evalue": f"the cell ended with status {status}", "traceback": []}
        return {**report, "error": [why]}
    return report if status != 0 else {**report, "error": []}


def main() -> None:
    """Judge the spec's cells; exit with the last visible cell's status (0 for a notebook)."""
    from sandbox_service.executor import isolation

    isolation.become_subreaper()  # the kernel forks anew for each visible cell: adopt each
    kernel = _Kernel()

    isolation.set_dumpable(False)  # its memory and descriptors: not the kernel's to read
    spec = json.loads(sys.stdin.buffer.read())
    nonce = spec["nonce"].encode()
    notebook = bool(spec.get("notebook"))
    if spec.get("seed") is not None:
        kernel.send({"seed": spec["seed"]})
    for index, cell in enumerate(spec.get("replay", [])):
        status, report = kernel.run({**cell, "silent": True, "notebook": False, "timeout": 0.0})
        if status != 0:
            [error] = _checked(status or 1, report)["error"][:1]
            _emit(
                nonce,
                {"replay_failed": index, "error": f"{error.get('ename')}: {error.get('evalue')}"},
            )
            kernel.finish(1)
    status = 0
    timeout = float(spec.get("cell_timeout_s", 0))
    for index, cell in enumerate(spec["cells"]):
        visible = {**cell, "silent": False, "notebook": notebook, "timeout": timeout}
        ran, report = kernel.run(visible)
        if ran is None:  # the kernel ended in this cell without finishing it: never ok
            _flush()
            os.close(kernel.commands)  # a kernel still alive reads the end, and exits
            os._exit(kernel.ended() or 1)
        status = ran
        _emit(nonce, {"cell": index, "status": status, **_checked(status, report)})
        _write_all(2, nonce)
    if spec.get("fetch"):
        _emit(nonce, {"files": _fetch(spec["fetch"])})
    kernel.finish(0 if notebook else status)
