"""C++, Java and Node.js through every front: the native API, SandboxFusion's ``/run_code``
(shaped as verl sends it) and code-judge's ``/run/batch`` and ``/judge``: right and wrong
answers, compile errors, runtime errors, time and memory limits, a fork bomb and a socket.

One service for the module, so each program compiles once (the compile cache serves the
same source to every front; the test of the cache counts it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from sandbox_service.executor import languages
from sandbox_service.executor.compile_cache import Build, CompileCache
from sandbox_service.executor.protocol import RunStatus
from sandbox_service.models import ExecuteRequest, Mode
from sandbox_service.service_process import ServiceProcess, start

MEMORY_MB = 128  # the memory tests' limit; code-judge's for this service

CPP = {
    "right": '#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a+b<<"\\n";}',
    "wrong": '#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a-b<<"\\n";}',
    "compile_error": "int main() { return undeclared; }",
    "runtime_error": '#include <stdexcept>\nint main(){ throw std::runtime_error("boom"); }',
    "timeout": "int main(){ volatile unsigned long x = 0; for (;;) x++; }",
    # Grows 8 MiB at a time, touching every page: the tree's limit, not one allocation.
    "memory": "#include <cstring>\n#include <vector>\n#include <unistd.h>\n"
    "int main(){ std::vector<char*> v; for (;;) { char* p = new char[8 << 20];"
    " memset(p, 1, 8 << 20); v.push_back(p); usleep(10000); } }",
    "fork_bomb": "#include <unistd.h>\nint main(){ for (;;) fork(); }",
    "socket": "#include <sys/socket.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n"
    "#include <cstdio>\nint main(){ int s = socket(AF_INET, SOCK_STREAM, 0);"
    ' if (s < 0) { puts("blocked"); return 0; } sockaddr_in a{}; a.sin_family = AF_INET;'
    ' a.sin_port = htons(PORTNUM); inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);'
    ' if (connect(s, (sockaddr*)&a, sizeof a) < 0) { puts("blocked"); return 0; }'
    ' puts("connected"); }',
}
JAVA = {
    "right": "import java.util.Scanner;\npublic class Main { public static void main(String[] x)"
    " { Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong()); } }",
    "compile_error": "public class Main { public static void main(String[] x) { int y = z; } }",
    "runtime_error": "public class Main { public static void main(String[] x) {"
    ' throw new RuntimeException("boom"); } }',
    "timeout": "public class Main { public static void main(String[] x) { while (true) {} } }",
}
NODE = {
    "right": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/)"
    ".map(Number); console.log(a + b);",
    "runtime_error": "throw new Error('boom');",
    "timeout": "for (;;) {}",
    "memory": "const kept = []; setInterval(() => kept.push(Buffer.alloc(8 << 20, 1)), 10);",
    "socket": "const s = require('net').connect(PORTNUM, '127.0.0.1');"
    " s.on('connect', () => { console.log('connected'); process.exit(0); });"
    " s.on('error', () => { console.log('blocked'); process.exit(0); });",
}


def _needs(tool: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} is not installed")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("languages") / "service.log"
    svc = start(str(log), slots=2, preload="math", max_timeout_s=30,
                codejudge_timeout_s=2, codejudge_memory_mb=MEMORY_MB)  # fmt: skip
    yield svc
    svc.stop()


def _code(programs: dict[str, str], case: str, service: ServiceProcess) -> str:
    return programs[case].replace("PORTNUM", str(service.port))


def native(service: ServiceProcess, language: str, code: str, **fields: Any) -> dict[str, Any]:
    body = {"code": code, "language": language, "stdin": "2 3", "timeout_s": 3, **fields}
    response = httpx.post(f"{service.url}/v1/execute", json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def fusion(service: ServiceProcess, language: str, code: str, **fields: Any) -> dict[str, Any]:
    """As verl's sandbox_fusion utils send it: one request per test case."""
    body = {"code": code, "language": language, "stdin": "2 3", "compile_timeout": 10,
            "run_timeout": 3, "memory_limit_MB": 1024, **fields}  # fmt: skip
    response = httpx.post(f"{service.url}/run_code", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


# ------------------------------------------------------------------ C++, every front


@_needs("g++")
def test_cpp_native(service: ServiceProcess) -> None:
    run = {case: native(service, "cpp", _code(CPP, case, service),
                        memory_mb=MEMORY_MB if case == "memory" else 1024)
           for case in CPP}  # fmt: skip
    assert (run["right"]["status"], run["right"]["stdout"]) == ("ok", "5\n")
    assert run["right"]["compile"]["status"] == "ok"
    assert (run["wrong"]["status"], run["wrong"]["stdout"]) == ("ok", "-1\n")
    failed = run["compile_error"]
    assert failed["status"] == "compile_error" and failed["stdout"] == ""
    assert failed["compile"]["status"] == "error" and failed["compile"]["exit_code"] != 0
    assert "undeclared" in failed["compile"]["stderr"]
    assert run["runtime_error"]["status"] == "error" and run["runtime_error"]["signal"] == 6
    assert "boom" in run["runtime_error"]["stderr"]
    assert run["timeout"]["status"] == "timeout"
    assert run["memory"]["status"] == "memory_limit", run["memory"]
    assert run["fork_bomb"]["status"] == "timeout"
    assert (run["socket"]["status"], run["socket"]["stdout"]) == ("ok", "blocked\n")
    again = native(service, "c++", CPP["right"], stdin="40 2")  # an alias; after the bomb
    assert (again["status"], again["stdout"], again["compile"]["cached"]) == ("ok", "42\n", True)


@_needs("g++")
def test_cpp_sandboxfusion_as_verl_reads_it(service: ServiceProcess) -> None:
    answer = {case: fusion(service, "cpp", _code(CPP, case, service),
                           memory_limit_MB=MEMORY_MB if case == "memory" else 1024)
              for case in CPP}  # fmt: skip
    right = answer["right"]
    assert right["status"] == "Success" and right["run_result"]["stdout"] == "5\n"
    assert right["compile_result"]["status"] == "Finished"
    assert right["compile_result"]["return_code"] == 0
    assert answer["wrong"]["status"] == "Success"
    assert answer["wrong"]["run_result"]["stdout"] == "-1\n"  # verl compares: False
    # verl's -4: Failed, compile_result Finished with a non-zero return code, nothing run.
    failed = answer["compile_error"]
    assert failed["status"] == "Failed" and failed["run_result"] is None
    assert failed["compile_result"]["status"] == "Finished"
    assert failed["compile_result"]["return_code"] != 0
    assert "undeclared" in failed["compile_result"]["stderr"]
    for case, status, code in [("runtime_error", "Finished", -6), ("memory", "Finished", -9),
                               ("timeout", "TimeLimitExceeded", None),
                               ("fork_bomb", "TimeLimitExceeded", None)]:  # fmt: skip
        run = answer[case]["run_result"]
        assert answer[case]["status"] == "Failed", (case, answer[case])
        assert (run["status"], run["return_code"]) == (status, code), (case, run)
    assert answer["socket"]["run_result"]["stdout"] == "blocked\n"
    go = fusion(service, "go", "package main")
    assert go["status"] == "SandboxError" and "language 'go'" in go["message"]
    fetch = fusion(service, "cpp", CPP["right"], fetch_files=["out.txt"])
    assert fetch["status"] == "SandboxError" and "fetch_files" in fetch["message"]


@_needs("g++")
def test_cpp_code_judge(service: ServiceProcess) -> None:
    cases = list(CPP)
    expected = {"right": "5", "wrong": "5", "socket": "blocked"}
    subs = [{"type": "cpp", "solution": _code(CPP, case, service), "input": "2 3",
             "expected_output": expected.get(case)} for case in cases]  # fmt: skip
    response = httpx.post(f"{service.url}/run/batch",
                          json={"type": "batch", "submissions": subs}, timeout=120)  # fmt: skip
    assert response.status_code == 200
    got = dict(zip(cases, response.json()["results"], strict=True))
    assert (got["right"]["success"], got["right"]["run_success"]) == (True, True)
    assert (got["wrong"]["success"], got["wrong"]["run_success"]) == (False, True)
    failed = got["compile_error"]
    assert (failed["run_success"], failed["reason"]) == (False, "")
    assert "undeclared" in failed["stderr"]
    for case in ("runtime_error", "memory"):
        assert (got[case]["run_success"], got[case]["reason"]) == (False, ""), got[case]
    for case in ("timeout", "fork_bomb"):
        assert (got[case]["run_success"], got[case]["reason"]) == (False, "worker_timeout")
    assert got["socket"]["success"] is True
    judged = httpx.post(f"{service.url}/judge", json=subs[0], timeout=120).json()
    assert judged["success"] is True and "stdout" not in judged
    math = httpx.post(f"{service.url}/run", json={"type": "math", "solution": "1"}).json()
    assert math["reason"] == "invalid_input" and "python, cpp" in math["stderr"]


# ------------------------------------------------------------------ Java and Node.js


@_needs("javac")
def test_java_native_and_sandboxfusion(service: ServiceProcess) -> None:
    run = {case: native(service, "java", JAVA[case], timeout_s=5) for case in JAVA}
    assert (run["right"]["status"], run["right"]["stdout"]) == ("ok", "5\n"), run["right"]
    assert run["compile_error"]["status"] == "compile_error"
    assert "cannot find symbol" in run["compile_error"]["compile"]["stderr"]
    assert run["runtime_error"]["status"] == "error" and "boom" in run["runtime_error"]["stderr"]
    assert run["timeout"]["status"] == "timeout"
    right = fusion(service, "java", JAVA["right"], run_timeout=5)
    assert right["status"] == "Success" and right["run_result"]["stdout"] == "5\n"
    failed = fusion(service, "java", JAVA["compile_error"])
    assert failed["status"] == "Failed" and failed["run_result"] is None
    assert failed["compile_result"]["return_code"] != 0


@_needs("node")
def test_nodejs_native_and_sandboxfusion(service: ServiceProcess) -> None:
    run = {case: native(service, "nodejs", _code(NODE, case, service),
                        memory_mb=MEMORY_MB if case == "memory" else 1024)
           for case in NODE}  # fmt: skip
    assert (run["right"]["status"], run["right"]["stdout"]) == ("ok", "5\n")
    assert run["right"]["compile"] is None
    assert run["runtime_error"]["status"] == "error" and "boom" in run["runtime_error"]["stderr"]
    assert run["timeout"]["status"] == "timeout"
    assert run["memory"]["status"] == "memory_limit", run["memory"]
    assert run["socket"]["stdout"] == "blocked\n"
    right = fusion(service, "nodejs", NODE["right"])
    assert right["status"] == "Success" and right["compile_result"] is None
    assert right["run_result"]["stdout"] == "5\n"
    alias = native(service, "javascript", "console.log(6 * 7)")
    assert alias["stdout"] == "42\n"


def test_status_lists_the_toolchains(service: ServiceProcess) -> None:
    found = httpx.get(f"{service.url}/v1/status").json()["languages"]
    assert set(found) == set(languages.NAMES)
    for name, version in found.items():
        lang = languages.lookup(name)
        present = lang.in_process or shutil.which(lang.toolchain) is not None
        assert version.startswith("unavailable") != present, (name, version)
    refused = httpx.post(f"{service.url}/v1/execute", json={"code": "x", "language": "go"})
    assert refused.status_code == 422 and "cpp" in refused.text


# ------------------------------------------------------------------ the compile cache


@_needs("g++")
def test_twenty_test_cases_compile_once(service: ServiceProcess) -> None:
    """verl's way: one request per test case, the same solution, sent at once."""
    code = CPP["right"] + "\n// twenty cases\n"
    with httpx.Client(timeout=120) as client, concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(
            lambda i: client.post(f"{service.url}/run_code", json={
                "code": code, "language": "cpp", "stdin": f"{i} 1"}).json(),
            range(20)))  # fmt: skip
    assert [a["run_result"]["stdout"] for a in answers] == [f"{i + 1}\n" for i in range(20)]
    compiles = {a["compile_result"]["execution_time"] for a in answers}
    assert len(compiles) == 1  # one compile's report, shared by all twenty


def test_cache_makes_once_and_keeps_within_its_bound() -> None:
    asyncio.run(asyncio.wait_for(_cache_makes_once(), 10))


async def _cache_makes_once() -> None:
    made = []

    async def make(size: int) -> Build:
        made.append(size)
        await asyncio.sleep(0.01)
        return Build(status=RunStatus.ok, files={"main": b"x" * size})

    cache = CompileCache(max_bytes=100)
    got = await asyncio.gather(*(cache.get("a", lambda: make(60)) for _ in range(5)))
    assert made == [60] and [cached for _, cached in got] == [False, True, True, True, True]
    await cache.get("b", lambda: make(60))  # over the bound: "a" goes
    assert len(cache) == 1 and cache.bytes == 60
    await cache.get("a", lambda: make(60))
    assert made == [60, 60, 60]
    timed_out = await cache.get("t", lambda: asyncio.sleep(0, Build(status=RunStatus.timeout)))
    assert not timed_out[1] and (await cache.get("t", lambda: make(1)))[1] is False


def test_sessions_and_repl_are_pythons_alone() -> None:
    with pytest.raises(ValidationError, match="session_id is for python only"):
        ExecuteRequest(code="x", language="cpp", session_id="s")
    with pytest.raises(ValidationError, match="repl"):
        ExecuteRequest(code="x", language="java", mode=Mode.repl)
    assert ExecuteRequest(code="x", language="js").language == "nodejs"
