"""Dependencies point one way: transport above policy above mechanism (README, Layout).

Read from the source with ``ast`` (imports inside functions included), so that a new import
that points upwards fails here rather than in a reader's head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sandbox_service"

# Each layer, from the top, as module-name prefixes; a module may import its own layer and the
# ones below it. ``settings`` and ``models`` are the shared vocabulary every layer may use.
TRANSPORT = ("cli", "http_server", "api", "client", "service_process", "sentinel_process")
POLICY = (
    "runtime", "worker_node", "slot_loop", "queue", "session_replay", "tenants", "metrics",
    "probe_server", "math_answer", "cell_program", "cell_driver", "cores", "descriptors",
)  # fmt: skip
MECHANISM = ("executor",)
SHARED = ("settings", "models")
LAYERS = [TRANSPORT, POLICY, MECHANISM]


def _layer(module: str) -> int | None:
    for depth, prefixes in enumerate(LAYERS):
        if module.split(".")[0] in prefixes:
            return depth
    return None


def _imports(path: Path) -> set[str]:
    """sandbox_service modules ``path`` imports, without the package prefix."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("sandbox_service."):
                found.add(name.removeprefix("sandbox_service."))
    return found


MODULES = sorted(
    p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
    for p in PACKAGE.rglob("*.py")
)


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if m != "__init__" and _layer(m) is None
                and m.split(".")[0] not in SHARED]  # fmt: skip
    assert unplaced == [], "add these to a layer in this test (and to the README's Layout)"


@pytest.mark.parametrize("module", MODULES)
def test_no_import_points_upwards(module: str) -> None:
    own = _layer(module)
    if own is None:  # the shared vocabulary: it may name nothing above the mechanism
        own = len(LAYERS) - 1
    path = PACKAGE / (module.replace(".", "/") + ".py")
    upward = sorted(
        name for name in _imports(path)
        if (depth := _layer(name)) is not None and depth < own
    )  # fmt: skip
    assert upward == [], f"{module} imports from a layer above it"


def test_the_mechanism_knows_nothing_of_queues_or_http() -> None:
    seen = set()
    for module in MODULES:
        if module.startswith("executor."):
            path = PACKAGE / (module.replace(".", "/") + ".py")
            seen |= {name.split(".")[0] for name in _imports(path)}
    assert seen <= {"executor", "settings"}, seen
