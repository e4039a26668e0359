"""verl 0.7.1's own sandbox-fusion code, unchanged, against a real service: its code reward
(``check_correctness``, ``compute_score``, ``default_compute_score``) and its
``SandboxFusionTool`` through real Ray."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from verl.tools.sandbox_fusion_tools import SandboxFusionTool
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.sandbox_fusion import compute_score
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

from sandbox_service.service_process import ServiceProcess

RIGHT = "n = int(input())\nprint(n * n)\n"
WRONG = "n = int(input())\nprint(n + n)\n"
CASES = {"inputs": ["3\n", "5\n"], "outputs": ["9\n", "25\n"]}


@pytest.fixture(scope="module")
def run_code(clients_service: ServiceProcess) -> str:
    return f"{clients_service.url}/run_code"


def test_check_correctness(run_code: str) -> None:
    assert check_correctness(run_code, CASES, RIGHT)[0] == [True, True]
    results, metadata = check_correctness(run_code, CASES, WRONG)
    assert results == [False, False]
    assert metadata[0]["stdout"] == "6\n" and metadata[0]["status"] == "wrong_answer"


def test_compute_score(run_code: str) -> None:
    right, _ = compute_score(run_code, None, 1024, f"```python\n{RIGHT}```", CASES)
    wrong, _ = compute_score(run_code, None, 1024, f"```python\n{WRONG}```", json.dumps(CASES))
    assert (right, wrong) == (1.0, 0.0)


def test_default_compute_score_sends_no_memory_limit(run_code: str) -> None:
    """Its default memory_limit_mb=None goes out as "memory_limit_MB": null."""
    scores = [
        default_compute_score(
            "codecontests", f"```python\n{code}```", json.dumps(CASES), sandbox_fusion_url=run_code
        )
        for code in (RIGHT, WRONG)
    ]
    assert scores == [1.0, 0.0]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code and return what it printed.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code."}},
            "required": ["code"],
        },
    },
}


def test_sandbox_fusion_tool_through_ray(run_code: str, local_ray: None) -> None:
    config = {"type": "native", "sandbox_fusion_url": run_code, "num_workers": 2, "rate_limit": 2}
    tool = SandboxFusionTool(config, OpenAIFunctionToolSchema.model_validate(SCHEMA))

    async def calls() -> list[str | None]:
        instance, _ = await tool.create()
        texts = []
        for code in ("import sympy\nprint(sympy.factor('x**2-1'))", "print(1/0)"):
            response, _, _ = await tool.execute(instance, {"code": code})
            texts.append(response.text)
        await tool.release(instance)
        return texts

    factored, failed = asyncio.run(calls())
    assert factored == "(x - 1)*(x + 1)\n"
    assert failed is not None and "ZeroDivisionError" in failed
