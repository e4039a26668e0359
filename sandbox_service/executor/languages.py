"""The languages this service runs, as data: one entry each, one code path for all of them.

As Judge0's table of languages and Piston's packages: an entry names the file the code is
written to, the command that compiles it (none for an interpreted language), the compile's
output the run needs, the command that runs it, and the compile's limits. Nothing else in
the service knows a language: the executor runs a ``RunSpec`` (``argv`` and files under
``Limits``), ``compiler.py`` turns a request into one or two of them. Adding a language is
one entry here (and its toolchain in the image: deploy/Dockerfile).

Python is the exception the table says explicitly: it runs in the zygote's own, preloaded
interpreter (no ``run`` command), which is what makes it fast.

Which entries work on a node is probed, not assumed (``toolchains``): a missing compiler is
reported by ``/v1/status`` and answered ``internal_error`` naming it, never a crash.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass

from sandbox_service.executor.protocol import Limits

# The JVM's own threads and start-up: one GC thread, no shared-memory performance file in the
# working directory (hsperfdata), the quick JIT for javac (a short program).
_JVM = ("-XX:+UseSerialGC", "-XX:-UsePerfData")
_JAVAC = tuple(f"-J{option}" for option in (*_JVM, "-XX:TieredStopAtLevel=1"))


@dataclass(frozen=True, kw_only=True)
class Language:
    """One entry of the table. ``run`` empty: Python, in the zygote's interpreter."""

    name: str
    aliases: tuple[str, ...] = ()
    source: str = ""  # the file the code is written to
    compile: tuple[str, ...] = ()  # argv of the compile step; empty: none
    artifacts: tuple[str, ...] = ()  # patterns of what the compile leaves that the run needs
    run: tuple[str, ...] = ()  # argv of the run
    compile_limits: Limits | None = None
    address_space: bool = True  # RLIMIT_AS too (off for runtimes that reserve far more)
    version: tuple[str, ...] = ()  # argv whose output names the toolchain (the cache key's)

    @property
    def in_process(self) -> bool:
        return not self.run

    @property
    def toolchain(self) -> str:
        """The command that must be installed for this entry to work."""
        return (self.compile or self.run or ("python",))[0]


LANGUAGES: tuple[Language, ...] = (
    Language(name="python", aliases=("python3",)),
    Language(
        name="cpp",
        aliases=("c++",),
        source="main.cpp",
        compile=("g++", "-O2", "-std=c++17", "-pipe", "-o", "main", "main.cpp"),
        artifacts=("main",),
        run=("./main",),
        compile_limits=Limits(timeout_s=30, memory_mb=1024),
        version=("g++", "--version"),
    ),
    Language(
        name="java",
        source="Main.java",
        compile=("javac", *_JAVAC, "-encoding", "UTF-8", "Main.java"),
        artifacts=("*.class",),
        run=("java", *_JVM, "-cp", ".", "Main"),
        compile_limits=Limits(timeout_s=30, memory_mb=1024, address_space=False),
        address_space=False,
        version=("javac", "-version"),
    ),
    Language(
        name="nodejs",
        aliases=("javascript", "js", "node"),
        source="main.js",
        run=("node", "main.js"),
        address_space=False,  # V8 reserves gigabytes of address space it never touches
        version=("node", "--version"),
    ),
)
BY_NAME: dict[str, Language] = {
    name: lang for lang in LANGUAGES for name in (lang.name, *lang.aliases)
}
NAMES: tuple[str, ...] = tuple(lang.name for lang in LANGUAGES)
ALL_NAMES: tuple[str, ...] = tuple(sorted(BY_NAME))  # aliases included
PYTHON_NAMES: tuple[str, ...] = tuple(n for n, lang in BY_NAME.items() if lang.name == "python")


class UnknownLanguage(ValueError):
    """No entry of the table has this name."""


def lookup(name: str) -> Language:
    """The entry named ``name`` or one of its aliases (case as given)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise UnknownLanguage(
            f"language {name!r} is not supported; supported: {', '.join(NAMES)}"
        ) from None


@functools.cache
def toolchain_version(lang: Language) -> str:
    """The first line its toolchain prints about itself, or ``unavailable: why``. Run once per
    process, outside any sandbox (no input of anyone's in it); part of the compile cache's
    key, so an upgraded compiler never serves an old build."""
    if lang.in_process:
        import platform

        return f"Python {platform.python_version()} (in the zygote)"
    if shutil.which(lang.toolchain) is None:
        return f"unavailable: {lang.toolchain} is not installed"
    try:
        done = subprocess.run(lang.version, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {' '.join(lang.version)}: {exc}"
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else f"unavailable: {' '.join(lang.version)} printed nothing"


def toolchains() -> dict[str, str]:
    """Each language → its toolchain's version on this node, or ``unavailable: why``."""
    return {lang.name: toolchain_version(lang) for lang in LANGUAGES}
