"""What a program sees and what comes back: output, exit codes, statuses, stdin, repl, files."""

from __future__ import annotations

import base64
import time

from sandbox_service.client import SandboxClient
from sandbox_service.models import ExecuteRequest, Mode, Status
from tests.helpers import processes_of


def test_ordinary_program(client: SandboxClient) -> None:
    r = client.execute("print(sum(range(1000)))")
    assert (r.status, r.exit_code, r.stdout, r.stderr) == (Status.ok, 0, "499500\n", "")
    assert r.wall_time_s > 0 and r.cpu_time_s > 0 and r.peak_memory_mb > 0
    assert r.worker


def test_preloaded_sympy_and_numpy(client: SandboxClient) -> None:
    code = "import sympy, numpy as np\nx = sympy.Symbol('x')\nprint(sympy.factor(x**2 - 1))\nprint(np.arange(4).sum())"
    r = client.execute(code)
    assert r.status is Status.ok, r.stderr
    assert r.stdout == "(x - 1)*(x + 1)\n6\n"


def test_exception_gives_traceback_and_exit_1(client: SandboxClient) -> None:
    r = client.execute("x = 1\n1/0")
    assert (r.status, r.exit_code) == (Status.error, 1)
    assert 'File "<string>", line 2' in r.stderr and "ZeroDivisionError" in r.stderr
    assert "child.py" not in r.stderr  # our own frames stay out of the user's traceback


def test_sys_exit_code(client: SandboxClient) -> None:
    r = client.execute("import sys; print('bye'); sys.exit(3)")
    assert (r.status, r.exit_code, r.stdout) == (Status.error, 3, "bye\n")
    assert client.execute("raise SystemExit(0)").status is Status.ok


def test_syntax_error(client: SandboxClient) -> None:
    r = client.execute("def f(:\n  pass")
    assert r.status is Status.error and "SyntaxError" in r.stderr


def test_stdin(client: SandboxClient) -> None:
    r = client.execute("import sys\nfor line in sys.stdin: print(int(line) * 2)", stdin="1\n2\n")
    assert r.stdout == "2\n4\n"
    big = "x" * 300_000  # larger than a pipe buffer
    assert client.execute("print(len(input()))", stdin=big).stdout == "300000\n"


def test_standard_streams_describe_the_childs_descriptors(client: SandboxClient) -> None:
    # The streams are made once in the zygote (on stand-ins of the child's descriptors): what
    # they learned there must hold in the child, as for streams the child made itself.
    code = (
        "import sys\n"
        "print(sys.stdin.seekable(), sys.stdout.seekable(), sys.stderr.seekable(),\n"
        "      sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdin.read())\n"
        "sys.stdin.seek(0)\n"
        "print(sys.stdin.read())\n"
        "sys.stdout.close()\n"
    )
    for zygote in ("", "import numpy\n"):  # the light zygote, then the full one
        r = client.execute(zygote + code, stdin="in")
        assert r.stdout == "True False False False True in\nin\n", r
    # Closing stdout above closed only that child's copy.
    assert client.execute("print('next')").stdout == "next\n"


def test_repl_mode_prints_final_expression(client: SandboxClient) -> None:
    r = client.execute("x = 21\nx * 2", mode=Mode.repl)
    assert r.stdout == "42\n"
    assert client.execute("print('a')\nNone", mode=Mode.repl).stdout == "a\n"
    assert client.execute("x = 21\nx * 2").stdout == ""  # script mode prints nothing


def test_files_written_into_working_directory(client: SandboxClient) -> None:
    files = {
        "data/in.txt": base64.b64encode(b"hello").decode(),
        "helper.py": base64.b64encode(b"VALUE = 7\n").decode(),
    }
    code = "import helper\nprint(open('data/in.txt').read(), helper.VALUE)"
    r = client.execute(ExecuteRequest(code=code, files=files))
    assert (r.status, r.stdout) == (Status.ok, "hello 7\n"), r.stderr


def test_dunder_main_and_random_differs_between_runs(client: SandboxClient) -> None:
    r = client.execute("print(__name__)")
    assert r.stdout == "__main__\n"
    code = "import random, numpy as np; print(random.random(), np.random.rand())"
    outs = {client.execute(code).stdout for _ in range(4)}
    assert len(outs) == 4  # children must not share the zygote's random state


def test_timeout_kills_whole_process_group(client: SandboxClient) -> None:
    code = (
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(os.getpid(), child.pid, flush=True)\n"
        "while True: pass"
    )
    start = time.monotonic()
    r = client.execute(code, timeout_s=1)
    elapsed = time.monotonic() - start
    assert r.status is Status.timeout and r.signal == 9
    assert 1.0 <= r.wall_time_s < 1.5  # the zygote's own clock
    assert elapsed < 5  # end to end, on a loaded 2-core machine
    status = client.status()
    if status.isolation.get("pid") is True:  # its pids are its namespace's: look by slot uid
        time.sleep(0.2)
        uids = {z.uid for z in status.slots + status.light_slots}
        assert processes_of(uids) == [], "a process of the execution survived the timeout"
        return
    for pid in map(int, r.stdout.split()):
        assert not _alive(pid), f"process {pid} survived the timeout"


def test_memory_limit(client: SandboxClient) -> None:
    """memory_limit when the limit was enforced (the cgroup's OOM kill, or the sampler's); an
    allocation refused outright never took memory, and is the program's own MemoryError."""
    r = client.execute("x = []\nwhile True: x.append(' ' * 10**7)", memory_mb=256)
    assert r.status is Status.memory_limit
    r = client.execute("import numpy as np\nx = []\nwhile True: x.append(np.ones(10**6))",
                       memory_mb=256)  # fmt: skip
    assert r.status is Status.memory_limit
    r = client.execute("b = bytearray(4 * 1024**3)")
    assert r.status is Status.error and "MemoryError" in r.stderr
    r = client.execute("import numpy as np; a = np.ones((1024, 1024, 600))", memory_mb=256)
    assert r.status is Status.error and "MemoryError" in r.stderr


def test_output_cap(client: SandboxClient) -> None:
    r = client.execute("print('x' * 10_000_000)")
    assert r.status is Status.output_limit and r.stdout_truncated
    assert len(r.stdout) == 65536  # the service in this test caps at 64 KiB
    r = client.execute("import sys\nwhile True: sys.stderr.write('e' * 4096)", timeout_s=5)
    assert r.status is Status.output_limit and r.stderr_truncated and not r.stdout_truncated


def test_binary_and_invalid_utf8_output(client: SandboxClient) -> None:
    r = client.execute("import sys; sys.stdout.buffer.write(b'ok\\xff\\xfe\\n')")
    assert r.status is Status.ok and r.stdout.startswith("ok") and "\ufffd" in r.stdout


def test_batch_keeps_order(client: SandboxClient) -> None:
    results = client.execute_batch([f"print({i} * {i})" for i in range(50)])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(50)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
