"""A kept stream of the in-process bus: what ``InProcessBus.ensure_stream`` keeps, bounded as
JetStream bounds a stream (an age, a number of messages, a number per subject).

The per-subject bound is what keeps a busy subject from pushing the others out: one event per
request on one subject would otherwise replace, within seconds, the rare events of every other
subject the stream exists to keep. Messages are kept per subject, each numbered in the order
they came, so a subject over its bound drops its own oldest, the stream over its bound drops
the oldest of all, and a replay reads them back in the order they came. The age bound is
applied when the stream is read (a replay, a new config): the counts bound the memory.

``InProcessBus._keep`` appends a message itself (it runs for every event a request leaves,
so it does not call into this module for it) and calls :meth:`KeptStream.trim` only when the
stream is over its whole bound.
"""

from __future__ import annotations

import heapq
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Iterator

__all__ = ["KeptStream"]

Entry = tuple[int, float, str, bytes]
"""One kept message: its number in the stream, its time (wall clock), subject and data."""


class KeptStream:
    """Owns one stream's subject patterns, its bounds and the messages it keeps (``by_subject``,
    ``count`` of them, ``next`` the number of the next one). Touched only from its bus's event
    loop; raises nothing."""

    __slots__ = (
        "by_subject",
        "count",
        "max_age",
        "max_msgs",
        "max_per_subject",
        "next",
        "patterns",
    )

    def __init__(
        self,
        patterns: tuple[tuple[str, ...], ...],
        max_age: float,
        max_msgs: int,
        max_per_subject: int | None = None,
    ) -> None:
        self.patterns = patterns
        self.max_age = max_age
        self.max_msgs = max_msgs
        self.max_per_subject = sys.maxsize if max_per_subject is None else max_per_subject
        self.by_subject: dict[str, deque[Entry]] = {}
        self.count = 0
        self.next = 0

    def takes_over(self, older: KeptStream, now: float) -> None:
        """Keep what ``older`` (this stream's previous config) kept, within these bounds."""
        self.by_subject, self.count, self.next = older.by_subject, older.count, older.next
        for kept in self.by_subject.values():
            while len(kept) > self.max_per_subject:
                kept.popleft()
                self.count -= 1
        self.trim(now)

    def trim(self, now: float | None = None) -> None:
        """Drop the oldest messages while there are more than ``max_msgs`` (and, given
        ``now``, those older than ``max_age``)."""
        oldest = -1.0 if now is None else now - self.max_age
        while self.count:
            subject, first = min(
                ((s, kept[0]) for s, kept in self.by_subject.items() if kept),
                key=lambda pair: pair[1][0],
            )
            if self.count <= self.max_msgs and first[1] >= oldest:
                return
            kept = self.by_subject[subject]
            kept.popleft()
            self.count -= 1
            if not kept:
                del self.by_subject[subject]

    def entries(self, now: float) -> Iterator[tuple[float, str, bytes]]:
        """Every message kept and not older than ``max_age`` at ``now``, ``(time, subject,
        data)``, in the order they came."""
        oldest = now - self.max_age
        for _, ts, subject, data in heapq.merge(*self.by_subject.values()):
            if ts >= oldest:
                yield ts, subject, data
