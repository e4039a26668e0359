"""Every snippet of docs/integrations.md, run against a real service as its trainer would."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from pydantic import BaseModel

from sandbox_service.service_process import ServiceProcess, start

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
SNIPPET = re.compile(r"<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
DOC_URL = "http://127.0.0.1:8000"


def snippets() -> dict[str, str]:
    return {name: body for name, _, body in SNIPPET.findall(DOC.read_text())}


def test_every_snippet_is_marked_for_a_test() -> None:
    text = DOC.read_text()
    fences = text.count("\n```") // 2
    assert fences == len(SNIPPET.findall(text)) == 7
    assert set(snippets()) == {"verl-tool-config", "rstar2-tool-config", "trl-tool",
                               "openai-tool-schema", "session", "rstar2-reward-program",
                               "derived-image"}  # fmt: skip


def _function_schema(schema: dict[str, Any], name: str, required: list[str]) -> None:
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == name and function["description"]
    assert function["parameters"]["type"] == "object"
    assert function["parameters"]["required"] == required
    assert set(function["parameters"]["properties"]) == set(required)


# The keys verl's loader reads, by its own rules: verl/tools/utils/tool_registry.py
# (volcengine/verl at b178a3c, lines 111-126 of initialize_tools_from_config) takes each
# entry of `tools`, its `class_name`, `ToolType(config.type)` ("native" or "mcp"; a missing
# key raises ConfigAttributeError) and, for native tools, validates `tool_schema` as
# verl/tools/schemas.py's OpenAIFunctionToolSchema before `tool_cls(config=..., ...)` (the
# same in verl 0.9.1 on PyPI, verl/tools/tool_registry.py, native only). verl is not installed
# here (it pulls torch and ray); these models copy its schema's fields. Run by hand against
# verl 0.9.1's own loader (installed --no-deps, its imports of torch and transformers stubbed),
# both snippets load and the old ones fail with ConfigAttributeError: Missing key type.
class VerlProperty(BaseModel):
    type: str
    description: str | None = None
    enum: list[str] | None = None


class VerlParameters(BaseModel):
    type: str
    properties: dict[str, VerlProperty]
    required: list[str]


class VerlFunction(BaseModel):
    name: str
    description: str
    parameters: VerlParameters


class VerlToolSchema(BaseModel):
    type: str
    function: VerlFunction


def verl_loads(text: str) -> list[dict[str, Any]]:
    """The tools of a tool config as verl's initialize_tools_from_config reads them; raises
    where it would."""
    tools: list[dict[str, Any]] = yaml.safe_load(text)["tools"]
    for tool in tools:
        assert isinstance(tool["class_name"], str) and "." in tool["class_name"]
        tool_type = tool["config"]["type"]  # KeyError where verl raises ConfigAttributeError
        assert tool_type in ("native", "mcp"), f"ToolType({tool_type!r}) raises ValueError"
        if tool_type == "native" and tool.get("tool_schema") is not None:
            VerlToolSchema.model_validate(tool["tool_schema"])
    return tools


def test_the_loader_check_refuses_what_verl_refused() -> None:
    """Issue 28: the snippets without `type` raised ConfigAttributeError in verl."""
    text = snippets()["verl-tool-config"].replace('      type: "native"\n', "", 1)
    with pytest.raises(KeyError):
        verl_loads(text)


def test_verl_tool_config(compat_service: ServiceProcess) -> None:
    [tool] = verl_loads(snippets()["verl-tool-config"])
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
    [tool] = verl_loads(snippets()["rstar2-tool-config"])
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


# The program rStar2-Agent's reward manager (rstar2_agent/reward/server.py: verify_math_prefix
# and verify_math_suffix) sends for each rollout, character for character.
REWARD_PROGRAM = """
from fused_compute_score import compute_score
import base64
solution_str = base64.b64decode("{}".encode()).decode()
ground_truth = base64.b64decode("{}".encode()).decode()
result = compute_score(solution_str, ground_truth)

print(f"<result>{{result}}</result>")
"""


def test_the_docs_show_the_reward_program() -> None:
    shown = snippets()["rstar2-reward-program"]
    shown = shown.replace('"<the response, base64>"', '"{}"')
    shown = shown.replace('"<the reference, base64>"', '"{}"')
    assert shown.replace("{result}", "{{result}}") == REWARD_PROGRAM.strip().replace("\n\n", "\n")


def test_the_derived_image_names_its_directory() -> None:
    lines = snippets()["derived-image"].splitlines()
    target = lines[1].split("--target ")[1].split()[0]
    assert lines[2] == f"ENV SANDBOX_PYTHON_PATH={target}"


# A stand-in for the release's fused_compute_score (its math-verify path), as `pip install
# --target DIR` would leave it: DIR/fused_compute_score/__init__.py.
SCORER = """
from math_verify import parse, verify

def compute_score(model_output, ground_truth):
    try:
        return 1.0 if verify(parse("\\\\boxed{" + ground_truth + "}"), parse(model_output)) else 0.0
    except Exception:
        return 0.0
"""


@pytest.fixture(scope="module")
def rstar2_reward_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service set up as docs/integrations.md's rStar2-Agent recipe says: the scorer's
    package in a directory named by python_path (and preloaded)."""
    packages = tmp_path_factory.mktemp("sandbox-packages")
    (packages / "fused_compute_score").mkdir()
    (packages / "fused_compute_score" / "__init__.py").write_text(SCORER)
    log = tmp_path_factory.mktemp("rstar2") / "service.log"
    svc = start(
        str(log), slots=1, python_path=str(packages), preload="math,sympy,fused_compute_score"
    )
    yield svc
    svc.stop()


def _reward(url: str, solutions: list[tuple[str, str]]) -> list[float]:
    """What CodeJudgeRewardManager.execute_tool_calls does: one long batch, the score read
    back from <result>...</result> (0.0 when absent)."""
    submissions = []
    for solution_str, ground_truth in solutions:
        a = base64.b64encode(solution_str.encode()).decode()
        b = base64.b64encode(ground_truth.encode()).decode()
        code = REWARD_PROGRAM.format(a, b)
        submissions.append({"type": "python", "solution": code, "input": None})
    body = {"type": "batch", "submissions": submissions}
    response = httpx.post(f"{url}/run/long-batch", json=body, timeout=120)
    response.raise_for_status()
    scores = []
    for result in response.json()["results"]:
        match = re.search(r"<result>(.*?)</result>", result["stdout"] or "")
        scores.append(float(match.group(1)) if match else 0.0)
    return scores


def test_rstar2_reward_manager_scores_both_ways(rstar2_reward_service: ServiceProcess) -> None:
    right = "So the area is $\\boxed{\\frac{1}{2}}$."
    wrong = "So the area is $\\boxed{3}$."
    assert _reward(rstar2_reward_service.url, [(right, "0.5"), (wrong, "0.5")]) == [1.0, 0.0]


def test_python_path_is_read_only_to_executions(rstar2_reward_service: ServiceProcess) -> None:
    """Read-only by the mount layer (the host is read-only to executions) or, without it, by
    the directory's owner: the slots' uids cannot write it."""
    url = rstar2_reward_service.url
    code = (
        "import fused_compute_score, os\n"
        "open(os.path.join(os.path.dirname(fused_compute_score.__file__), 'x'), 'w')"
    )
    result = httpx.post(f"{url}/v1/execute", json={"code": code}, timeout=60).json()
    assert result["status"] == "error"
    assert "Read-only file system" in result["stderr"] or "Permission denied" in result["stderr"]
