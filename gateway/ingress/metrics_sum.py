"""``/metrics`` summed across the workers of ``llmgw serve --workers N``.

Under ``--workers`` the supervisor gives every worker one ``PROMETHEUS_MULTIPROC_DIR``
(prometheus-client's multiprocess mode: each process writes its values to memory-mapped files
there, a dead worker's counts included). :class:`SummedRegistry` renders what one worker
answers: the per-request families summed over every worker's files, and the families that
mirror global state (circuits, availability, operator events, the request log's counters)
from this worker alone, since every worker mirrors the same state and a sum would count it N
times. Without the variable (one process) nothing here is used.

Writing a value to its file on every update (a lock, a pid check, a pack into the mapped file)
cost a worker about three times what an in-memory update costs, for each of the dozen or so
updates of a request. :func:`defer_writes` makes this process's values written once per event
loop iteration instead: an update changes the value in memory and marks it, and one callback
at the end of the iteration writes every marked value. A scrape sees every request a worker
had finished one iteration earlier (the scraped worker writes its own first); a worker killed
by a signal it cannot handle loses at most its last iteration's updates.
"""

from __future__ import annotations

import asyncio
import atexit
import os
from typing import TYPE_CHECKING, Any

from prometheus_client import values
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The directory the workers share their metric files in, or None (one process)."""
    return os.environ.get(ENV) or None


def defer_writes() -> None:
    """Have the metric values made from now on in this process (files of the multiprocess
    mode, see the module) written once per loop iteration. Once per process; a no-op unless
    prometheus-client is in its multiprocess mode."""
    base = values.ValueClass
    if getattr(base, "_multiprocess", False) and not getattr(base, "deferred", False):
        values.ValueClass = _deferred(base)


def write_deferred() -> None:
    """Write this process's values updated since their last write (before reading files)."""
    write = getattr(values.ValueClass, "write_marked", None)
    if write is not None:
        write()


def _deferred(base: Any) -> Any:
    """A subclass of prometheus-client's file-backed value class whose updates are written
    by one callback per loop iteration (directly when no loop runs in this thread)."""
    marked: list[Any] = []

    def write_marked() -> None:
        todo = marked[:]
        marked.clear()
        for value in todo:
            value.marked = False
            base.set(value, value._value, value._timestamp or None)

    class DeferredValue(base):  # type: ignore[misc]
        deferred = True
        marked = False

        def inc(self, amount: float) -> None:
            self._value += amount
            self._timestamp = 0.0
            self._mark()

        def set(self, value: float, timestamp: float | None = None) -> None:
            self._value = value
            self._timestamp = timestamp or 0.0
            self._mark()

        def _mark(self) -> None:
            if self.marked:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop here: write now
                base.set(self, self._value, self._timestamp or None)
                return
            if not marked:
                loop.call_soon(write_marked)
            self.marked = True
            marked.append(self)

    DeferredValue.write_marked = staticmethod(write_marked)
    atexit.register(write_marked)  # a clean stop keeps its last iteration's updates
    return DeferredValue


class SummedRegistry:
    """A collector over ``own`` (this worker's registry) and ``path`` (every worker's files):
    ``summed`` families from the files, every other family from ``own``."""

    def __init__(self, own: CollectorRegistry, path: str, summed: frozenset[str]) -> None:
        self._own = own
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._summed = summed

    def collect(self) -> Iterable[Metric]:
        """The exposition's families (prometheus-client's collector protocol)."""
        write_deferred()
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.name in self._summed:
                yield metric
        for metric in self._own.collect():
            if metric.name not in self._summed:
                yield metric
