"""Which zygote a program should fork from: the light one (standard library preloads only)
when it imports nothing else, the full one (numpy, sympy, ...) otherwise.

Only speed depends on the choice, never behaviour: a program on the light zygote that imports
numpy after all still gets it, at the import's price. So the scan over-approximates: any
``import X`` or ``from X import`` anywhere in the text (strings and comments included), and
any dynamic import, sends the program to the full zygote. Measured on this project's 2-core
VM (docs/benchmarks.md): a trivial program costs about a quarter less CPU forked from the
light zygote.
"""

from __future__ import annotations

import re
import sys

STDLIB = frozenset(sys.stdlib_module_names)
_FROM = re.compile(r"\bfrom\s+(\.*[\w.]*)\s+import\b")
_IMPORT = re.compile(r"\bimport\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)")
_DYNAMIC = re.compile(r"__import__|\bimportlib\b|\bimport_module\b")


def stdlib_only(modules: list[str]) -> list[str]:
    """The entries of a preload list that belong to the standard library."""
    return [m for m in modules if m.partition(".")[0] in STDLIB]


def imports_only_stdlib(code: str) -> bool:
    """True if every module ``code`` may import is in the standard library."""
    if "import" not in code:
        return True  # most tool calls: one substring search and done
    if _DYNAMIC.search(code):
        return False
    names = [m.group(1) for m in _FROM.finditer(code)]
    for m in _IMPORT.finditer(_FROM.sub(" ", code)):  # "from m import name": name is no module
        names.extend(part.split()[0] for part in m.group(1).split(","))
    return all(name and not name.startswith(".") and name.partition(".")[0] in STDLIB
               for name in names)  # fmt: skip
