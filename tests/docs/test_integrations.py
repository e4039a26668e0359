"""Every snippet of docs/integrations.md, run against a real service as its trainer would."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from sandbox_service.service_process import ServiceProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
SNIPPET = re.compile(r"<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
DOC_URL = "http://127.0.0.1:8000"


def snippets() -> dict[str, str]:
    return {name: body for name, _, body in SNIPPET.findall(DOC.read_text())}


def test_every_snippet_is_marked_for_a_test() -> None:
    text = DOC.read_text()
    fences = text.count("\n```") // 2
    assert fences == len(SNIPPET.findall(text)) == 5
    assert set(snippets()) == {"verl-tool-config", "rstar2-tool-config", "trl-tool",
                               "openai-tool-schema", "session"}  # fmt: skip


def _function_schema(schema: dict[str, Any], name: str, required: list[str]) -> None:
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == name and function["description"]
    assert function["parameters"]["type"] == "object"
    assert function["parameters"]["required"] == required
    assert set(function["parameters"]["properties"]) == set(required)


def test_verl_tool_config(compat_service: ServiceProcess) -> None:
    [tool] = yaml.safe_load(snippets()["verl-tool-config"])["tools"]
    assert tool["class_name"] == "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    _function_schema(tool["tool_schema"], "code_interpreter", ["code"])
    config = tool["config"]
    url = config["sandbox_fusion_url"].replace(DOC_URL, compat_service.url)
    assert urlsplit(url).path == "/run_code"
    # What verl's SandboxFusionTool.execute_code -> call_sandbox_api sends and reads.
    timeout = config["default_timeout"]
    payload = json.dumps({
        "compile_timeout": timeout, "run_timeout": timeout, "code": "print(6 * 7)",
        "stdin": None, "memory_limit_MB": config["memory_limit_mb"],
        "language": config["default_language"], "files": {}, "fetch_files": [],
    })  # fmt: skip
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = httpx.post(url, content=payload, headers=headers, timeout=2 * timeout + 10)
    response.raise_for_status()
    run = response.json()["run_result"]
    assert run["status"] == "Finished" and run["stdout"] + run["stderr"] == "42\n"


def test_rstar2_tool_config(compat_service: ServiceProcess) -> None:
    [tool] = yaml.safe_load(snippets()["rstar2-tool-config"])["tools"]
    assert tool["class_name"] == "rstar2_agent.tools.code_judge_tool.PythonTool"
    _function_schema(tool["tool_schema"], "python_code_with_standard_io", ["code", "input"])
    config = tool["config"]
    assert f"http://{config['host_addr']}:{config['host_port']}" == DOC_URL
    # The URL and body rStar2-Agent's run_tool_calls_on_server_async builds.
    url = f"{compat_service.url}/run/long-batch"
    call: dict[str, Any] = {"name": "python_code_with_standard_io",
            "arguments": {"code": "print(sum(map(int, input().split())))", "input": "1 2 3"}}  # fmt: skip
    body = {"type": "batch", "submissions": [
        {"type": "python", "solution": call["arguments"]["code"],
         "input": call["arguments"]["input"]},
    ]}  # fmt: skip
    response = httpx.post(url, json=body, timeout=60)
    response.raise_for_status()
    [result] = response.json()["results"]
    assert result["run_success"] and result["success"] and result["stdout"] == "6\n"


@pytest.fixture
def trl_tool(compat_service: ServiceProcess, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SANDBOX_URL", compat_service.url)
    namespace: dict[str, Any] = {}
    exec(compile(snippets()["trl-tool"], "trl-tool", "exec"), namespace)
    yield namespace["python_code_with_standard_io"]
    namespace["sandbox"].close()


def test_trl_tool_function(trl_tool: Any) -> None:
    assert trl_tool(code="print(input()[::-1])", input="stressed") == "desserts\n"
    failed = trl_tool(code="1/0", input="")
    assert failed.endswith("[error]") and "ZeroDivisionError" in failed
    transformers = pytest.importorskip("transformers.utils")
    schema = transformers.get_json_schema(trl_tool)
    _function_schema(schema, "python_code_with_standard_io", ["code", "input"])


def test_openai_tool_schema_drives_the_tool(trl_tool: Any) -> None:
    schema = json.loads(snippets()["openai-tool-schema"])
    _function_schema(schema, "python_code_with_standard_io", ["code", "input"])
    # A model's call, as the rStar2 format writes it, dispatched by the schema's name.
    text = ('<tool_call>{"name": "python_code_with_standard_io", "arguments": '
            '{"code": "import math\\nprint(math.comb(int(input()), 2))", "input": "10"}}'
            "</tool_call>")  # fmt: skip
    found = re.search(r"<tool_call>(.*?)</tool_call>", text, re.S)
    assert found is not None
    call = json.loads(found.group(1))
    tools = {schema["function"]["name"]: trl_tool}
    assert tools[call["name"]](**call["arguments"]) == "45\n"


def test_session_snippet(compat_service: ServiceProcess) -> None:
    code = snippets()["session"].replace(DOC_URL, compat_service.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "session", "exec"), {})
    assert printed.getvalue() == "x**2 + 2*x + 1\n"
