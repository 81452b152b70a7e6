"""``/metrics`` summed across the workers of ``llmgw serve --workers N``.

Under ``--workers`` the supervisor gives every worker one ``PROMETHEUS_MULTIPROC_DIR``
(prometheus-client's multiprocess mode: each process writes its values to memory-mapped files
there, a dead worker's counts included). :class:`SummedRegistry` renders what one worker
answers: the per-request families summed over every worker's files, and the families that
mirror global state (circuits, availability, operator events, the request log's counters)
from this worker alone, since every worker mirrors the same state and a sum would count it N
times. Without the variable (one process) nothing here is used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The directory the workers share their metric files in, or None (one process)."""
    return os.environ.get(ENV) or None


class SummedRegistry:
    """A collector over ``own`` (this worker's registry) and ``path`` (every worker's files):
    ``summed`` families from the files, every other family from ``own``."""

    def __init__(self, own: CollectorRegistry, path: str, summed: frozenset[str]) -> None:
        self._own = own
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._summed = summed

    def collect(self) -> Iterable[Metric]:
        """The exposition's families (prometheus-client's collector protocol)."""
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.name in self._summed:
                yield metric
        for metric in self._own.collect():
            if metric.name not in self._summed:
                yield metric
