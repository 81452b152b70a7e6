"""How many cores this process may use: ``llmgw serve --workers auto`` starts one worker each.

The cores it may run on (its affinity: ``taskset``, a cpuset), fewer when its cgroup caps its
CPU time below that (``docker run --cpus 2``, Kubernetes' ``limits.cpu``, systemd's
``CPUQuota``): a container on a 64-core host limited to 2 CPUs would otherwise start 64 workers
that share 2 cores' time, each with its own memory. The cap is the smallest quota of the
process's cgroup and its ancestors, rounded up (1.5 CPUs: 2 workers); cgroup v2
(``cpu.max``) and v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_SELF = Path("/proc/self/cgroup")


def usable_cores(root: Path = _CGROUP_ROOT, own: Path = _SELF) -> int:
    """The cores this process may use: its affinity, capped by its cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = cores or os.cpu_count() or 1
    quota = cgroup_quota(root, own)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_quota(root: Path = _CGROUP_ROOT, own: Path = _SELF) -> float | None:
    """The CPUs' worth of time this process's cgroups allow it (None: no limit, or none
    known here)."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy
            limits += _each_level(root, path, _v2)
        elif "cpu" in controllers.split(","):
            limits += _each_level(root / controllers, path, _v1)
    return min(limits) if limits else None


def _each_level(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quota set at ``path`` and at each of its ancestors under ``mount``."""
    found: list[float] = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        quota = read(mount.joinpath(*parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _v2(group: Path) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        quota, period = (group / "cpu.max").read_text().split()
        if quota != "max":
            return int(quota) / int(period)
    return None


def _v1(group: Path) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    return None
