"""Watching a local service through /proc: found from its port, its tree, its leftovers."""

from __future__ import annotations

import os
from pathlib import Path

from loadtests.procwatch import count_entries, listening_pid, read_proc, tree
from sandbox_service.service_process import ServiceProcess, free_port


def test_the_listening_process_is_found_from_the_port(own_service: ServiceProcess) -> None:
    assert listening_pid(own_service.port) == own_service.process.pid
    assert listening_pid(free_port()) is None


def test_tree_holds_the_api_process_and_its_zygotes(own_service: ServiceProcess) -> None:
    procs = tree(own_service.process.pid)
    assert procs[0].pid == own_service.process.pid
    zygotes = [p for p in procs if p.ppid == own_service.process.pid]
    assert len(zygotes) == 4 and all(p.rss_mb > 10 for p in zygotes)  # full and light ones


def test_read_proc_of_this_process() -> None:
    me = read_proc(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.state in "RS"
    assert read_proc(2**22 + 1) is None


def test_count_entries(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "f").write_text("x")
    assert count_entries(str(tmp_path)) == 3
    assert count_entries(str(tmp_path / "missing")) is None
