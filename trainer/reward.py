"""The reward: 1 when the rollout's last boxed answer verifies against the reference, else 0.

Verification is ``sandbox_service.math_answer`` (math-verify), the code behind the service's
``/v1/verify``. Two rules on top, both from the report: a truncated rollout (length or turn
limit) scores 0 whatever it wrote (the caller passes ``truncated=False`` under
``reward.zero_truncated: false``, the release's rule); and only the model's own text is
read, never a tool response, so a program that prints ``\\boxed{42}`` earns nothing (the
release decodes the whole response, tool output included).
"""

from __future__ import annotations

from sandbox_service.math_answer import verify


def reward(model_text: str, reference: str, *, truncated: bool, require_answer_tag: bool) -> float:
    if truncated:
        return 0.0
    return (
        1.0 if verify(model_text, reference, require_answer_tag=require_answer_tag).correct else 0.0
    )
