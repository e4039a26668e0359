"""The rStar2-Agent release's own tools and reward manager, unchanged (tests/clients/
rstar2_release), against the service's code-judge front."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.tools.schemas import OpenAIFunctionToolSchema

from sandbox_service.service_process import ServiceProcess
from tests.clients.conftest import REWARD_PORT
from tests.clients.loading import register_release_packages

register_release_packages()
from rstar2_agent.reward.server import CodeJudgeRewardManager  # noqa: E402
from rstar2_agent.tools.code_judge_tool import CodeJudgeTool, PythonTool, SimJupyterTool  # noqa: E402


def _schema(name: str, arguments: list[str]) -> OpenAIFunctionToolSchema:
    """An OpenAI-style function schema with string ``arguments``, all required."""
    properties = {a: {"type": "string", "description": a} for a in arguments}
    function = {"name": name, "description": name, "parameters": {"type": "object",
                "properties": properties, "required": arguments}}  # fmt: skip
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})


async def _call(tool_class: type[CodeJudgeTool], url_port: int, schema: OpenAIFunctionToolSchema,
                calls: list[dict[str, Any]], **create: Any) -> list[str | None]:  # fmt: skip
    """Each call through one instance of the tool, as the release's agent loop makes them."""
    config = {"type": "native", "host_addr": "127.0.0.1", "host_port": url_port,
              "request_processor_batch_size": 4, "request_processor_batch_timeout_seconds": 0.1}  # fmt: skip
    tool = tool_class(config, schema)  # its aiohttp session binds to this event loop
    try:
        instance, _ = await tool.create(**create)
        texts = [(await tool.execute(instance, call))[0].text for call in calls]
        await tool.release(instance)
    finally:
        await tool.request_processor.stop()
        await tool.request_processor._session.close()
    return texts


def test_python_tool_runs_code_with_input(clients_service: ServiceProcess) -> None:
    schema = _schema("python_code_with_standard_io", ["code", "input"])
    calls = [{"code": "print(int(input()) ** 2)", "input": "12"}, {"code": "1/0", "input": ""}]
    squared, failed = asyncio.run(_call(PythonTool, clients_service.port, schema, calls))
    assert squared is not None and squared.startswith("Tool call success\nstdout: 144")
    assert failed is not None and failed.startswith("Tool call failure")
    assert "ZeroDivisionError" in failed


class _Call:
    """A tool call of the history, as verl's agent loop hands it to ``create``."""

    def __init__(self, code: str) -> None:
        self.name = "jupyter_code"
        self.arguments = json.dumps({"code": code})


def test_sim_jupyter_tool_replays_history(clients_service: ServiceProcess) -> None:
    """The cell sees the state of the calls before it (the release replays them) and shows
    its last expression's value."""
    schema = _schema("jupyter_code", ["code"])
    calls = [{"code": "y = x * 7\ny"}]
    history = [_Call("x = 6")]
    (text,) = asyncio.run(
        _call(SimJupyterTool, clients_service.port, schema, calls, history_tool_calls=history)
    )
    assert text is not None and text.startswith("Tool call success") and "42" in text


def test_reward_manager_scores_right_and_wrong(clients_service: ServiceProcess) -> None:
    """As the release runs it: its programs go to localhost:8088, import the release's
    fused_compute_score in the sandbox, and print the score."""
    if clients_service.port != REWARD_PORT:
        pytest.skip(f"port {REWARD_PORT} was taken; the reward manager calls only that one")
    responses = ["So the area is $\\boxed{\\frac{1}{2}}$.", "So the area is $\\boxed{3}$."]
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.ones(2, 3, dtype=torch.long),
            "responses": torch.ones(2, 4, dtype=torch.long),
            "attention_mask": torch.ones(2, 7, dtype=torch.long),
        },
        non_tensors={
            "response_text": np.array(responses, dtype=object),
            "reward_model": np.array([{"ground_truth": "0.5"}] * 2, dtype=object),
        },
    )
    rewards = CodeJudgeRewardManager(tokenizer=None, num_examine=0)(data)
    assert isinstance(rewards, torch.Tensor)
    assert rewards[:, -1].tolist() == [1.0, 0.0] and rewards[:, :-1].abs().sum() == 0
