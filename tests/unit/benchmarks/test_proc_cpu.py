"""The benchmark's CPU reading of a server that is a tree of processes (``llmgw serve
--workers N``: a supervisor, its workers, its nats-server): every process under the watched
one counts, those alive through the window by their growth, those born inside it whole."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.benchmarks.proc_cpu import TreeSample, tree_cpu, tree_cpu_spent

if TYPE_CHECKING:
    from collections.abc import Iterator

BURN_S = 0.3  # CPU seconds the grandchild burns, on its own clock
# /proc counts CPU in clock ticks (10 ms): a sample may lag by a tick per counter.
TICKS = 0.03

# A supervisor that, on its first input line, starts a worker which starts a burner; all
# three share its pipes. The burner says "ready", burns BURN_S of CPU after the next line,
# prints the CPU it spent burning and in all, then ends on a third line.
_BURNER = f"""
import sys, time
print("ready", flush=True)
sys.stdin.readline()
t0 = time.process_time()
while time.process_time() - t0 < {BURN_S}:
    pass
t1 = time.process_time()
print(t1 - t0, t1, flush=True)
sys.stdin.readline()
"""
_WORKER = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {_BURNER!r}]))"
_SUPERVISOR = (
    "import subprocess, sys; sys.stdin.readline(); "
    f"sys.exit(subprocess.call([sys.executable, '-c', {_WORKER!r}]))"
)


@dataclass(frozen=True)
class _Window:
    """Two samples of the supervisor's tree and what the burner says it spent: burning
    (inside the window) and in all (its start included)."""

    start: TreeSample
    end: TreeSample
    burned: float
    burner_total: float


class _Tree:
    """The supervisor process and its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SUPERVISOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _hear(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _sample(self) -> TreeSample:
        sample = tree_cpu(self.proc.pid)
        assert sample is not None
        return sample

    def window(self, *, born_inside: bool) -> _Window:
        """Sample the tree before and after the burn; the worker and the burner start
        inside the window if ``born_inside``, else before it. Then let them all end."""
        before = self._sample() if born_inside else None
        self._say("start")
        assert self._hear() == "ready"
        start = before if before is not None else self._sample()
        self._say("go")
        burned, total = (float(v) for v in self._hear().split())
        end = self._sample()
        self._say("bye")
        assert self.proc.wait() == 0
        return _Window(start, end, burned, total)


@pytest.fixture
def tree() -> Iterator[_Tree]:
    t = _Tree()
    yield t
    t.proc.kill()  # its worker and burner end on their closed stdin
    t.proc.communicate()


def _own(sample: TreeSample, pid: int) -> float:
    return next(seconds for (p, _), seconds in sample.items() if p == pid)


def test_a_grandchild_alive_through_the_window_counts_by_what_it_spent_in_it(
    tree: _Tree,
) -> None:
    w = tree.window(born_inside=False)

    spent = tree_cpu_spent(w.start, w.end)
    assert w.burned - TICKS <= spent <= w.burned + TICKS
    assert len(w.start) == len(w.end) == 3  # supervisor, worker, burner
    # The supervisor alone (what the benchmark used to read) waited through it all.
    assert _own(w.end, tree.proc.pid) - _own(w.start, tree.proc.pid) <= TICKS


def test_processes_born_inside_the_window_count_whole(tree: _Tree) -> None:
    w = tree.window(born_inside=True)

    assert tree_cpu_spent(w.start, w.end) >= w.burner_total - TICKS
    assert len(w.start) == 1 and len(w.end) == 3


def test_a_process_gone_reads_as_none() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert tree_cpu(gone.pid) is None
