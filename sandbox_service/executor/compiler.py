"""A request in any language of the table, as the executions it takes: a compile (once per
program and node, through the compile cache) and a run, on the slot that took the request.

One code path for every language (``languages.py`` holds what differs). The compile is an
execution like any other: the same zygote, confinement and kinds of limits (the entry's:
time, memory, output), so untrusted source meets the compiler only inside the sandbox, and a
compile that runs past its time is a compile error, not a hang. A compile that fails is the
submission's fault: ``compile_error``, with the compiler's output in the report. A toolchain
this node lacks, or a compile the sandbox itself failed at, is ``internal_error``.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import hashlib
from dataclasses import dataclass, replace
from typing import Protocol

import orjson

from sandbox_service.executor import languages
from sandbox_service.executor.compile_cache import Build, CompileCache
from sandbox_service.executor.languages import Language
from sandbox_service.executor.protocol import Outcome, RunSpec, RunStatus


class Executes(Protocol):
    """What runs one execution: a slot (``Slot.execute``)."""

    async def execute(self, spec: RunSpec[str]) -> Outcome[str]: ...


@dataclass(frozen=True)
class Compiled:
    """The compile step of one request: its build, and whether the cache already had it."""

    build: Build
    cached: bool


def cache_key(lang: Language, spec: RunSpec[str], toolchain: str) -> str:
    """Everything that decides a build, hashed: never a name a caller chose."""
    files = sorted(spec.files.items()) if isinstance(spec.files, dict) else []
    decided = [lang.name, lang.compile, lang.artifacts, toolchain, spec.code, files]
    return hashlib.sha256(orjson.dumps(decided)).hexdigest()


def compile_spec(lang: Language, spec: RunSpec[str]) -> RunSpec[str]:
    assert lang.compile_limits is not None
    return RunSpec(code=spec.code, limits=lang.compile_limits, files=spec.files,
                   language=lang.name, argv=list(lang.compile), source=lang.source,
                   collect=list(lang.artifacts))  # fmt: skip


def build_of(lang: Language, outcome: Outcome[str]) -> Build:
    """The build a finished compile made: ok only if it left every artifact the run needs."""
    files = outcome.artifact_files()
    status, message = outcome.status, outcome.message
    missing = [p for p in lang.artifacts if not fnmatch.filter(files, p)]
    if status is RunStatus.ok and missing:
        status, message = RunStatus.error, f"the compiler left no {', '.join(missing)}"
    return Build(status=status, exit_code=outcome.exit_code, signal=outcome.signal,
                 stdout=outcome.stdout,
                 stderr=outcome.stderr, wall_time_s=outcome.wall_time_s, message=message,
                 files=files if status is RunStatus.ok else {})  # fmt: skip


def run_spec(lang: Language, spec: RunSpec[str], build: Build | None) -> RunSpec[str]:
    """The run of ``spec`` in ``lang``: the build's files beside the caller's (the build's
    win a clash), or the source itself for an interpreted language."""
    limits = replace(spec.limits, address_space=lang.address_space)
    base = replace(spec, argv=list(lang.run), limits=limits, language=lang.name)
    if build is None:
        return replace(base, source=lang.source)
    files = dict(spec.files) if isinstance(spec.files, dict) else {}
    files.update({name: base64.b64encode(data).decode() for name, data in build.files.items()})
    return replace(base, code="", source="", files=files, executables=sorted(build.files))


def compile_failed(build: Build) -> Outcome[str]:
    why = build.message or (f"exit status {build.exit_code}" if build.exit_code else "")
    how = f"{build.status.value}: {why}" if why else build.status.value
    return Outcome(status=RunStatus.compile_error, message=f"compilation failed ({how})")


class Compiler:
    """Runs requests of every language of the table on the slots of one node."""

    def __init__(self, cache_bytes: int) -> None:
        self.cache = CompileCache(cache_bytes)

    async def execute(
        self, slot: Executes, spec: RunSpec[str]
    ) -> tuple[Outcome[str], Compiled | None]:
        """The run's outcome (``compile_error`` when the compile failed) and the compile
        step's report, None for a language without one. ``SlotCrashed`` as ``slot.execute``."""
        lang = languages.lookup(spec.language)
        if lang.in_process:
            return await slot.execute(spec), None
        toolchain = await asyncio.to_thread(languages.toolchain_version, lang)
        if toolchain.startswith("unavailable"):
            why = f"{lang.name} cannot run on this node: {toolchain}"
            return Outcome(status=RunStatus.internal_error, message=why), None
        if not lang.compile:
            return await slot.execute(run_spec(lang, spec, None)), None

        async def make() -> Build:
            return build_of(lang, await slot.execute(compile_spec(lang, spec)))

        build, cached = await self.cache.get(cache_key(lang, spec, toolchain), make)
        if build.status is RunStatus.internal_error:  # the sandbox's fault: never kept
            return Outcome(status=RunStatus.internal_error, message=build.message), None
        compiled = Compiled(build, cached)
        if not build.ok:
            return compile_failed(build), compiled
        return await slot.execute(run_spec(lang, spec, build)), compiled
