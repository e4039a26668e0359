"""The rStar2-Agent release's vendored modules, imported without its packages' ``__init__``.

``rstar2_agent/__init__.py`` imports the release's agent loop and tool parser, which need
verl's rollout stack (vLLM, SGLang, the chat templates) that this suite does not install. So
``rstar2_agent``, ``rstar2_agent.tools`` and ``rstar2_agent.reward`` are registered here as
bare packages whose path is the vendored directory: the files under test
(``tools/code_judge_tool.py``, ``tools/code_judge_utils.py``, ``tools/request_processor.py``,
``reward/server.py``) then import as the release imports them, byte for byte unchanged.
verl itself needs no stand-ins: it is installed (``--no-deps``) with the light packages its
reward and tool modules import.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

RELEASE = Path(__file__).parent / "rstar2_release"


def register_release_packages() -> None:
    """Register the release's packages bare, once, so their modules import unchanged."""
    for name in ("rstar2_agent", "rstar2_agent.tools", "rstar2_agent.reward"):
        if name in sys.modules:
            continue
        package = types.ModuleType(name)
        package.__path__ = [str(RELEASE.joinpath(*name.split(".")))]
        sys.modules[name] = package
