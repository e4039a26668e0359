"""Workloads: parsing, mixes, user files, and every shipped expectation against a real service."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from loadtests.generator import Plan, Recorder, drive
from loadtests.targets import HttpTarget
from loadtests.workloads import SHIPPED, Context, Item, WorkloadError, parse
from sandbox_service.service_process import ServiceProcess


def test_item_check_wants_status_and_exact_stdout() -> None:
    item = Item("k", {"code": "print(1)"}, "1\n")
    assert item.check({"status": "ok", "stdout": "1\n"})
    assert not item.check({"status": "ok", "stdout": "1"})
    assert not item.check({"status": "error", "stdout": "1\n"})
    anything = Item("k", {"code": "x"}, None, frozenset({"timeout"}))
    assert anything.check({"status": "timeout", "stdout": "partial"})


def test_parse_shipped_and_mixes() -> None:
    assert parse("mixed") is SHIPPED["mixed"]
    mix = parse("trivial:3,sympy:1")
    kinds = Counter(i.kind.split(".")[0] for i in mix.items(4000, seed=1))
    assert 2.5 < kinds["trivial"] / kinds["sympy"] < 3.5
    assert not parse("trivial,adversarial").unconfined_safe
    with pytest.raises(WorkloadError, match="unknown workload 'nope'"):
        parse("nope")
    with pytest.raises(WorkloadError, match="not a number"):
        parse("trivial:x")


def test_items_are_reproducible_from_the_seed() -> None:
    first = [i.request for i in parse("mixed").items(50, seed=7)]
    assert first == [i.request for i in parse("mixed").items(50, seed=7)]
    assert first != [i.request for i in parse("mixed").items(50, seed=8)]


def test_mixed_has_the_shape_of_tool_calls() -> None:
    kinds = Counter(i.kind.split(".")[0] for i in parse("mixed").items(20_000, seed=3))
    share = {k: v / 20_000 for k, v in kinds.items()}
    assert 0.25 < share["sympy"] < 0.30 and 0.17 < share["numpy"] < 0.23
    assert 0.07 < share["error"] < 0.11 and 0.005 < share["timeout"] < 0.02


def test_file_workload(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    lines = [
        {"code": "print(6 * 7)", "expected_stdout": "42\n"},
        {"code": "1/0", "expected_status": "error"},
        {"code": "print('free')"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    items = list(parse(f"file:{path}").items(5))
    assert [i.request["code"] for i in items] == [
        "print(6 * 7)",
        "1/0",
        "print('free')",
        "print(6 * 7)",
        "1/0",
    ]
    assert "expected_stdout" not in items[0].request and items[0].stdout == "42\n"
    assert items[1].statuses == {"error"} and "internal_error" not in items[2].statuses
    path.write_text('{"code": "print(1)"}\n{"code": 3}\n')
    with pytest.raises(WorkloadError, match="line 2: not a valid request"):
        parse(f"file:{path}")
    path.write_text("not json\n")
    with pytest.raises(WorkloadError, match="line 1: not JSON"):
        parse(f"file:{path}")


def test_every_shipped_expectation_holds_on_the_service(own_service: ServiceProcess) -> None:
    """Each template of each workload once: the service answers what the item expects.
    Adversarial ones included (loops, bombs, floods, fork bombs, network probes)."""
    ctx = Context(port=own_service.port)
    items = [item for w in SHIPPED.values() for item in w.every_template(seed=5, ctx=ctx)]
    recorder = Recorder()
    plan = Plan(len(items), concurrency=len(items), batch=len(items), duration_s=60, drain_s=60)
    asyncio.run(drive(HttpTarget(own_service.url), items, plan, recorder))
    assert recorder.lost == 0
    assert recorder.wrong == 0, recorder.wrong_examples
    assert recorder.answered == len(items)
