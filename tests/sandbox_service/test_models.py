"""The contract's models: defaults and validation messages name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox_service.models import ExecuteRequest, Mode, check_relative_path


def test_defaults_match_the_contract() -> None:
    r = ExecuteRequest(code="1")
    assert (r.stdin, r.language, r.timeout_s, r.memory_mb, r.mode, r.files, r.id) == (
        "", "python", 10.0, 1024, Mode.script, {}, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("path", "ok"),
    [("a.txt", True), ("d/e/f.py", True), ("./x", True), ("/abs", False), ("../x", False),
     ("a/../../b", False), ("a/..", False), ("", False), (".", False), ("a\x00b", False)],
)  # fmt: skip
def test_file_paths(path: str, ok: bool) -> None:
    if ok:
        assert check_relative_path(path)
    else:
        with pytest.raises(ValueError):
            check_relative_path(path)


def test_errors_name_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        ExecuteRequest(code="1", language="ruby", files={"x": "@@"})
    fields = {e["loc"][0] for e in info.value.errors()}
    assert fields == {"language", "files"}
    assert "supported: python" in str(info.value)
