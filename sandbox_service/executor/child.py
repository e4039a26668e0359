"""The forked child's side of one execution: confine itself, then run the program.

``start`` runs in the child the zygote just forked: it puts the pipes in place, decodes the
request in its own memory (and zeroes its copy of the zygote's buffer), sets the rlimits,
drops to the slot's uid, loads the seccomp filter, writes the request's files, and closes the
status descriptor; a failure before that is reported on it as ``SETUP_ERROR``. Then ``run``
runs the user's program in a fresh ``__main__``. Output, tracebacks and exit codes match
``python -c CODE`` (filename ``<string>``), except that tracebacks also show the source
lines. ``repl`` mode prints the repr of a final expression, as IPython and the rStar2 tool do.
A command (``RunSpec.argv``: a compiler, a compiled program, another language's runtime)
instead replaces the child once it is confined (``exec_program``). Nothing is reported
besides stdout, stderr and the exit status: the status descriptor, the
setup's channel to the zygote, is closed before the first line of user code runs, so whatever
the program writes or does, the verdict is the parent's (``judge.py``).
"""

from __future__ import annotations

import ast
import base64
import io
import linecache
import math
import os
import resource
import shutil
import sys
import traceback
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from sandbox_service.executor import isolation as iso
from sandbox_service.executor import memory, payload, protocol
from sandbox_service.executor.monitor import SETUP_ERROR, Pipes
from sandbox_service.executor.protocol import RunSpec, ZygoteConfig

if TYPE_CHECKING:
    from sandbox_service.executor.startup import Confinement

FILENAME = "<string>"
STATUS_FD = 3
SETUP_FAILED = 125  # the child's exit status when it failed before user code
EXEC_FAILED = 127  # as a shell answers a command it could not run
EXEC_ADDRESS_SLACK_MB = 256
MIB = 1024 * 1024


def _fresh_main() -> dict[str, object]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


def _compile(code: str, mode: str) -> tuple[types.CodeType, types.CodeType | None]:
    """Return (body, final expression or None); raises SyntaxError like Python would."""
    if mode != "repl":
        return compile(code, FILENAME, "exec"), None
    tree = ast.parse(code, FILENAME, "exec")
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
        return compile(tree, FILENAME, "exec"), compile(last, FILENAME, "eval")
    return compile(tree, FILENAME, "exec"), None


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream must not change the verdict
            pass


def _print_repr(value: object) -> None:
    print(repr(value))


def run(
    code: str,
    mode: str,
    namespace: dict[str, object] | None = None,
    display: Callable[[object], None] = _print_repr,
) -> int:
    """Execute ``code``; return the process exit status Python itself would give.

    ``namespace`` (default: a fresh ``__main__``) lets several programs share state, as the
    cells of a notebook do; ``display`` receives the value of a final expression in repl mode.
    """
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    if namespace is None:
        namespace = _fresh_main()
    try:
        body, last = _compile(code, mode)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                display(value)
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException as exc:  # the program's own error: report it as Python does
        tb = exc.__traceback__
        # Drop this function's frame so the traceback starts at the user's code.
        tb = tb.tb_next if tb is not None and not isinstance(exc, SyntaxError) else tb
        # As CPython does for an uncaught exception: a driver of several programs reads it.
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        try:
            traceback.print_exception(type(exc), exc, tb)
        except MemoryError:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def standard_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """stdin, stdout and stderr on descriptors 0, 1 and 2, as ``python -c`` opens them."""
    return (
        io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),
        io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
        ),
        io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
            line_buffering=True,
        ),
    )  # fmt: skip


# Made once in the zygote and never used there, so that a child finds them ready: made in a
# fresh child they cost it ~0.2 ms of CPU (the first allocations after fork fault their pages
# in; docs/benchmarks.md, 2026-12-04).
_STREAMS: tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper] | None = None


def prepare_streams() -> None:
    """Make the streams every child will use, on descriptors of the kinds a child has (a memfd
    for stdin, pipes for output): what a stream learns of its descriptor when it is made
    (seekable or not) must hold in the child. Called by the zygote before it forks any."""
    global _STREAMS
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        for fd, like in ((0, stdin), (1, w), (2, w)):
            os.dup2(like, fd)
        _STREAMS = standard_streams()
    finally:
        for fd, old in zip((0, 1, 2), saved, strict=True):
            os.dup2(old, fd)
            os.close(old)
        for fd in (stdin, r, w):
            os.close(fd)


def reset_interpreter(workdir: str) -> None:
    """Give the child the state a fresh ``python -c`` would have, not the zygote's."""
    sys.stdin, sys.stdout, sys.stderr = _STREAMS or standard_streams()
    for name in ("stdin", "stdout", "stderr"):  # the originals too: some code writes to those
        setattr(sys, f"__{name}__", getattr(sys, name))
    sys.argv = ["-c"]
    sys.path[0] = ""
    if os.environ.get("HOME") != workdir:  # the zygote set everything else already
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    # Every child starts from the zygote's memory: without this, each execution would draw
    # the same numpy "random" numbers (the random module reseeds itself after fork).
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed(int.from_bytes(os.urandom(4), "little"))


def environment(workdir: str) -> dict[str, str]:
    """The whole environment of user code: nothing of the service's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def close_setup_channel() -> None:
    """From here on nothing the process writes reaches the zygote but its output: a status
    written after this would be the program's word, not the service's."""
    os.close(STATUS_FD)


def exec_program(spec: RunSpec[memoryview], workdir: str) -> NoReturn:
    """Replace this process by ``spec.argv``, in the working directory: from here on it is the
    command's, with the environment of user code and the confinement already in place (the
    seccomp filter, the rlimits and the uid survive ``exec``). A command not on ``PATH`` is the
    node's fault (a missing toolchain), reported before the setup channel closes."""
    env = environment(workdir)
    path = shutil.which(spec.argv[0], path=env["PATH"])
    if path is None:
        raise FileNotFoundError(f"{spec.argv[0]!r} is not installed on this node")
    if spec.limits.address_space:
        room = exec_address_space(spec.limits.memory_mb)
        resource.setrlimit(resource.RLIMIT_AS, (room, room))
    close_setup_channel()
    try:
        os.execve(path, spec.argv, env)
    except OSError as exc:
        os.write(2, f"cannot run {spec.argv[0]}: {exc}\n".encode())
    os._exit(EXEC_FAILED)


def exec_address_space(memory_mb: int) -> int:
    """``RLIMIT_AS`` of a command exec'd in the interpreter's place: twice its memory limit and
    a margin for its libraries, a backstop against one huge allocation; the limit itself is
    the tree's (cgroup or sampler), which a program reaches first as it touches its pages."""
    return (2 * memory_mb + EXEC_ADDRESS_SLACK_MB) * MIB


def main(code: str, mode: str, workdir: str) -> None:
    reset_interpreter(workdir)
    close_setup_channel()
    status = run(code, mode)
    _flush()
    os._exit(status)


# ---------------------------------------------------------------- confinement


def _write_files(files: dict[str, str]) -> None:
    for path, data in files.items():
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


def _write_program(spec: RunSpec[memoryview], code: str) -> None:
    """An exec'd command's source file and executables, in the working directory."""
    if spec.source:
        with open(spec.source, "wb") as f:
            f.write(code.encode("utf-8", "surrogatepass"))
    for name in spec.executables:
        os.chmod(name, 0o755)


def cpu_limit_s(timeout_s: float) -> int:
    """RLIMIT_CPU of each process of an execution: a backstop past the wall-clock limit."""
    return math.ceil(timeout_s) + 1


def _decode_request(
    spec: RunSpec[memoryview], buffer: payload.Payload
) -> tuple[str, dict[str, str]]:
    """The code and files of ``spec``, decoded in the child's own memory; then the child's copy
    of the zygote's buffer is zeroed, so that nothing forked off user code finds the request
    there (a driver's spec travels on stdin: ``cell_driver.py``)."""
    code = bytes(spec.code).decode("utf-8", "surrogatepass")
    files = spec.files
    if isinstance(files, memoryview):
        files = protocol.decode_payload("files", bytes(files))
    buffer.wipe()
    return code, files or {}


def start(spec: RunSpec[memoryview], pipes: Pipes, config: ZygoteConfig,
          confinement: Confinement, workdir: str, zygote_pid: int,
          buffer: payload.Payload) -> NoReturn:  # fmt: skip
    """In the child just forked: take the pipes as its descriptors, confine itself and run the
    program; never returns. A failure before user code is written on the status descriptor."""
    os.setsid()
    os.dup2(pipes.stdin, 0)
    os.dup2(pipes.out_w, 1)
    os.dup2(pipes.err_w, 2)
    os.dup2(pipes.st_w, STATUS_FD)
    os.closerange(STATUS_FD + 1, 1 << 16)
    try:
        _confine_and_run(spec, config, confinement, workdir, zygote_pid, buffer)
    except BaseException as exc:
        try:
            msg = f"{SETUP_ERROR.decode()} {type(exc).__name__}: {exc}"
            os.write(STATUS_FD, msg.encode())
        finally:
            os._exit(SETUP_FAILED)
    os._exit(SETUP_FAILED)  # not reached: the program's end is os._exit


def _confine_and_run(spec: RunSpec[memoryview], config: ZygoteConfig, confinement: Confinement,
                     workdir: str, zygote_pid: int, buffer: payload.Payload) -> None:  # fmt: skip
    """Confine this process (descriptors already in place) and run the program."""
    code, files = _decode_request(spec, buffer)
    # An exec'd command gets an address-space limit of its own just before exec
    # (exec_program): until then this process still maps the whole zygote.
    address_space = (
        confinement.base_address_space + spec.limits.memory_mb * MIB
        if spec.in_process
        else resource.RLIM_INFINITY
    )
    uid = config.uid if confinement.uid and config.uid is not None else os.getuid()
    gid = (config.gid if config.gid is not None else uid) if confinement.uid else os.getgid()
    iso.set_limits(
        address_space=address_space,
        cpu_seconds=cpu_limit_s(spec.limits.timeout_s),
        file_size=config.max_file_mb * MIB,
        open_files=config.max_open_files,
        processes=config.max_processes if confinement.uid else confinement.shared_process_limit,
    )
    if confinement.cgroup is not None:
        memory.make_killable()
    if confinement.uid:
        iso.drop_to(uid, gid)
    iso.die_with_parent()  # after the uid change, which clears it
    iso.set_dumpable(True)  # its own /proc/self as any process has (the zygote's is hidden)
    if os.getppid() != zygote_pid:
        os._exit(SETUP_FAILED)
    os.chdir(workdir)
    _write_files(files)
    if not spec.in_process:
        _write_program(spec, code)
    if confinement.filter is not None:
        iso.no_new_privs()
        confinement.filter.load()
    if not spec.in_process:
        exec_program(spec, workdir)
    main(code, spec.mode.value, workdir)
