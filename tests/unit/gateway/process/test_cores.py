"""``gateway.process.cores``: ``--workers auto`` counts the cores this process may use, capped by
its cgroup's CPU quota (v2 ``cpu.max``, v1 CFS quota), the smallest of its cgroup and theirs
above it, rounded up."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from gateway.process.cores import cgroup_quota, usable_cores

if TYPE_CHECKING:
    from pathlib import Path


def _v2(root: Path, path: str, cpu_max: str | None) -> None:
    group = root / path.strip("/")
    group.mkdir(parents=True, exist_ok=True)
    if cpu_max is not None:
        (group / "cpu.max").write_text(cpu_max + "\n")


def _own(tmp_path: Path, text: str) -> Path:
    own = tmp_path / "self-cgroup"
    own.write_text(text)
    return own


def test_a_v2_quota_of_one_and_a_half_cpus_is_two_workers(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _v2(root, "/", None)
    _v2(root, "/app.slice/gw.service", "150000 100000")
    own = _own(tmp_path, "0::/app.slice/gw.service\n")

    assert cgroup_quota(root, own) == 1.5
    assert usable_cores(root, own) == min(2, len(os.sched_getaffinity(0)))


def test_the_smallest_quota_on_the_way_up_counts(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _v2(root, "/kubepods", "100000 100000")
    _v2(root, "/kubepods/pod1/c1", "400000 100000")
    own = _own(tmp_path, "0::/kubepods/pod1/c1\n")

    assert cgroup_quota(root, own) == 1.0
    assert usable_cores(root, own) == 1


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _v2(root, "/", "max 100000")
    own = _own(tmp_path, "0::/\n")

    assert cgroup_quota(root, own) is None
    assert usable_cores(root, own) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("quota", "expected"), [("-1", None), ("50000", 0.5)])
def test_a_v1_cfs_quota(tmp_path: Path, quota: str, expected: float | None) -> None:
    group = tmp_path / "cgroup" / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text(quota + "\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    own = _own(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")

    assert cgroup_quota(tmp_path / "cgroup", own) == expected
    assert usable_cores(tmp_path / "cgroup", own) >= 1


def test_no_cgroup_file_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path, tmp_path / "missing") is None
