"""A run's scratch directories are named after its process; the sweep removes a dead run's
and nothing else."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

from gateway.process.scratch import METRICS_PREFIX, NATS_PREFIX, make_scratch, sweep_dead_runs

if TYPE_CHECKING:
    from pathlib import Path


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_scratch_directory_is_private_and_named_after_its_process() -> None:
    made = make_scratch(NATS_PREFIX)
    try:
        assert made.name.startswith(f"{NATS_PREFIX}{os.getpid()}-")
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        made.rmdir()


def test_the_sweep_removes_a_dead_runs_directories_only(tmp_path: Path) -> None:
    dead = _dead_pid()
    gone = [tmp_path / f"{NATS_PREFIX}{dead}-a1", tmp_path / f"{METRICS_PREFIX}{dead}-b2"]
    for each in gone:
        (each / "js").mkdir(parents=True)
        (each / "nats-server.conf").write_text('password: "secret"')
    kept = [
        tmp_path / f"{NATS_PREFIX}{os.getpid()}-c3",  # a live run's
        tmp_path / f"{NATS_PREFIX}x{dead}-d4",  # not a run's name
        tmp_path / f"other-{dead}-e5",
    ]
    for each in kept:
        each.mkdir()
    not_a_dir = tmp_path / f"{METRICS_PREFIX}{dead}-f6"
    not_a_dir.write_text("a file")

    removed = sweep_dead_runs(tmp_path)

    assert sorted(removed) == sorted(gone)
    assert not any(each.exists() for each in gone)
    assert all(each.exists() for each in (*kept, not_a_dir))


def test_a_run_killed_and_not_yet_reaped_is_dead_to_the_sweep(tmp_path: Path) -> None:
    zombie = subprocess.Popen(["true"])
    try:
        (tmp_path / f"{NATS_PREFIX}{zombie.pid}-z").mkdir()
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped

        assert [p.name for p in sweep_dead_runs(tmp_path)] == [f"{NATS_PREFIX}{zombie.pid}-z"]
    finally:
        zombie.wait()


def test_the_sweep_of_a_missing_root_removes_nothing(tmp_path: Path) -> None:
    assert sweep_dead_runs(tmp_path / "absent") == []
