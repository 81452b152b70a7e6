"""Actor snapshots in a key-value bucket, written only under a held lease.

The guarantee: once another host's compare-and-set took a unit's owner entry, every later
snapshot write of the previous owner is refused, and none of its earlier writes can
overwrite what the new owner wrote. Two fences give it: before each write the owner entry's
revision must still be the lease's, and each snapshot key is itself written by
compare-and-set on the revision this owner last saw, a revision the new owner moves on
loading (it rewrites the key as it reads it). A refused write is logged and reported to
``on_lost``, which stops the unit; it is not raised into the actor.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from actors.stores.snapshots import SnapshotStore
from bus import KvConflictError

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.cluster.placement import Lease, Owners
    from bus import KeyValue

logger = logging.getLogger(__name__)

SNAPSHOTS_BUCKET = "llmgw_snapshots"


class FencedSnapshots(SnapshotStore):
    """The SnapshotStore of one placed unit: snapshots in ``kv`` fenced by ``lease``.

    ``load`` and ``save`` raise BusClosedError when JetStream cannot be reached.
    """

    def __init__(
        self, kv: KeyValue, owners: Owners, lease: Lease, on_lost: Callable[[], None]
    ) -> None:
        # Not SnapshotStore.__init__: no SQLite connection; only load and save are used.
        self._kv = kv
        self._owners = owners
        self._lease = lease
        self._on_lost = on_lost
        self._seen: dict[str, int] = {}  # snapshot name -> its revision this owner wrote
        self.refused = 0

    async def load(self, name: str) -> bytes | None:
        """The snapshot ``name``, taken over for this lease (so an older owner's pending
        write can no longer land)."""
        while True:
            entry = await self._kv.get(name)
            try:
                if entry is None:
                    self._seen[name] = 0
                    return None
                self._seen[name] = await self._kv.update(name, entry.value, revision=entry.revision)
            except KvConflictError:
                continue  # written between our read and our take-over: read it again
            return entry.value

    async def save(self, name: str, data: bytes, now: float) -> None:
        """Replace the snapshot ``name`` if this lease still holds; else refuse (logged)."""
        if name not in self._seen:
            await self.load(name)
        if not await self._owners.holds(self._lease):
            self._refuse(name, "the lease is lost")
            return
        seen = self._seen[name]
        try:
            if seen == 0:
                self._seen[name] = await self._kv.create(name, data)
            else:
                self._seen[name] = await self._kv.update(name, data, revision=seen)
        except KvConflictError:
            self._refuse(name, "another owner wrote it")

    async def aclose(self) -> None:
        """Nothing to close: the bucket belongs to the bus."""

    def _refuse(self, name: str, why: str) -> None:
        self.refused += 1
        logger.warning(
            "refused a snapshot of %s from %s for %s: %s",
            name,
            self._lease.node,
            self._lease.unit,
            why,
        )
        self._on_lost()
