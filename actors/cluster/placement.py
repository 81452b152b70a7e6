"""Who owns which actor: rendezvous hashing over the live hosts, and leases recorded in the
owners bucket with a fencing revision.

An owner entry is ``key = unit name, value = node id``; its revision is the fencing token.
A host starts a unit only after its compare-and-set put its id there, and a write of the
unit's state is accepted only while that revision is still the entry's (``fenced.py``). A
unit held by a live host is never claimed from it: that host releases it first (break
before make); one held by a host that is gone is taken over by compare-and-set, so of two
survivors racing for it exactly one wins.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus import KvConflictError

if TYPE_CHECKING:
    from collections.abc import Collection

    from bus import KeyValue

OWNERS_BUCKET = "llmgw_owners"


def owner_of(unit: str, nodes: Collection[str]) -> str:
    """The host of ``nodes`` that should own ``unit`` (highest random weight): the same on
    every host that sees the same live set, and a host leaving moves only its own units.
    Raises ValueError for no nodes."""
    if not nodes:
        raise ValueError(f"no live host to own {unit!r}")
    return max(nodes, key=lambda node: (_weight(node, unit), node))


def _weight(node: str, unit: str) -> bytes:
    return hashlib.blake2b(f"{node}\x00{unit}".encode(), digest_size=8).digest()


@dataclass(frozen=True, slots=True)
class Lease:
    """``node`` owns ``unit`` as of owner-entry revision ``revision`` (the fencing token)."""

    unit: str
    node: str
    revision: int


class Owners:
    """The owners bucket: claim, check and release leases. Raises BusClosedError."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def claim(self, unit: str, node: str, live: Collection[str]) -> Lease | None:
        """Take ``unit`` for ``node``: when nobody holds it, when its holder is not in
        ``live``, or when ``node`` holds it already (a restart under the same id: a new
        revision fences the previous incarnation). None when a live host holds it or
        another host won the race."""
        entry = await self._kv.get(unit)
        try:
            if entry is None:
                return Lease(unit, node, await self._kv.create(unit, node.encode()))
            holder = entry.value.decode()
            if holder != node and holder in live:
                return None
            rev = await self._kv.update(unit, node.encode(), revision=entry.revision)
        except KvConflictError:
            return None
        return Lease(unit, node, rev)

    async def holds(self, lease: Lease) -> bool:
        """True while ``lease`` is the unit's current entry."""
        entry = await self._kv.get(lease.unit)
        return entry is not None and entry.revision == lease.revision

    async def holder(self, unit: str) -> str | None:
        """The node id recorded as ``unit``'s owner, if any."""
        entry = await self._kv.get(unit)
        return None if entry is None else entry.value.decode()

    async def all(self) -> dict[str, str]:
        """Every unit with an owner entry, and the node id recorded for it."""
        found: dict[str, str] = {}
        for unit in await self._kv.keys():
            entry = await self._kv.get(unit)
            if entry is not None:
                found[unit] = entry.value.decode()
        return found

    async def release(self, lease: Lease) -> None:
        """Delete the entry if it is still ``lease`` (a lost lease is left to its new owner)."""
        try:
            await self._kv.delete(lease.unit, revision=lease.revision)
        except KvConflictError:
            return
