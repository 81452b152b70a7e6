"""Tables of entries that expire, keyed by callers (affinity keys, which a client's addresses
or headers make): swept lazily, and at a cost that does not grow with every insertion.

A table swept whenever it is past a fixed threshold is scanned whole on every insertion once
that many callers are live (a thousand users in five minutes is enough): each routing
decision then costs in proportion to the callers. :func:`sweep` leaves the next sweep for
when the table has doubled, and drops the least recently written entries past :data:`CAP`
(a flood of distinct callers costs the oldest pins, not the process's memory).
"""

from __future__ import annotations

import itertools
from typing import Protocol, TypeVar

CAP = 100_000
"""Entries one table keeps at most."""


class Expiring(Protocol):
    """An entry with the wall-clock second it lapses at."""

    expires: float


E = TypeVar("E", bound=Expiring)


def sweep(table: dict[str, E], now: float, threshold: int) -> tuple[int, int]:
    """Drop the entries of ``table`` expired at ``now``, then its oldest (first inserted)
    past :data:`CAP`; returns how many expired, and the size past which the next sweep is due
    (twice what is left, at least ``threshold``)."""
    dead = [key for key, entry in table.items() if entry.expires <= now]
    for key in dead:
        del table[key]
    if (excess := len(table) - CAP) > 0:
        for key in list(itertools.islice(table, excess)):
            del table[key]
    return len(dead), max(threshold, 2 * len(table))
