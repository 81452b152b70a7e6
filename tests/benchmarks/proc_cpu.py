"""CPU time of a process and of every process under it, read from Linux ``/proc``.

What ``bench.py``'s load generator samples at both edges of a measured window for each
server it watches, so a server of several processes counts whole: ``llmgw serve --workers N``
is a supervisor (the actors) with N ingress workers and, unless ``--bus`` names one, its own
nats-server as children. A sample holds each process of the tree by pid and start time (a
reused pid is another process); the window's CPU is each process's growth, a process born
inside the window counted from zero. A process that ended inside the window is not counted:
its time left ``/proc`` with it (a worker killed mid-window is not a benchmark's case).
"""

from __future__ import annotations

import os
from pathlib import Path

# A process in a sample: (pid, start time in clock ticks since boot).
Process = tuple[int, int]
TreeSample = dict[Process, float]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[Process, float] | None:
    """The process's identity and its user plus system CPU seconds; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # After "pid (comm) ": state is field 3, utime 14, stime 15, starttime 22 (proc(5)).
    fields = stat[stat.rindex(")") + 2 :].split()
    return (pid, int(fields[19])), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children now: the ``children`` list of each of its threads (a
    child belongs to the thread that forked it). Empty once ``pid`` is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            kids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return kids


def tree_cpu(pid: int) -> TreeSample | None:
    """CPU seconds of ``pid`` and of each of its descendants alive now, by process; None
    when ``pid`` itself is gone (or ``/proc`` cannot be read)."""
    root = _stat(pid)
    if root is None:
        return None
    sample: TreeSample = {root[0]: root[1]}
    todo = children(pid)
    while todo:
        kid = todo.pop()
        found = _stat(kid)
        if found is not None and found[0] not in sample:
            sample[found[0]] = found[1]
            todo += children(kid)
    return sample


def tree_cpu_spent(start: TreeSample, end: TreeSample) -> float:
    """CPU seconds the tree spent between two of its samples: the growth of every process
    in ``end``, one absent from ``start`` (born in between) from zero."""
    return sum(seconds - start.get(proc, 0.0) for proc, seconds in end.items())
