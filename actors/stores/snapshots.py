"""Actor snapshots: what must outlive a restart (weight overrides and affinity pins of
ModelActors, circuits and benches of EndpointActors, key mutes of KeyPoolActors).

One row per actor name in the shared SQLite file; an actor loads its snapshot in
``on_start`` and saves it when its durable state changes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

import msgspec

from actors.stores.db import Migration, open_db

if TYPE_CHECKING:
    from pathlib import Path

    import aiosqlite

logger = logging.getLogger(__name__)

T = TypeVar("T")

SNAPSHOTS = Migration(
    "actor_snapshots",
    (
        "CREATE TABLE IF NOT EXISTS actor_snapshots ("
        " name TEXT PRIMARY KEY, data BLOB NOT NULL, updated REAL NOT NULL)",
    ),
)


class SnapshotStore:
    """Reads and writes actors' snapshots. Raises sqlite3.Error on storage failure."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SnapshotStore:
        """Open (creating) the store in the database at ``path``."""
        return cls(await open_db(path, [SNAPSHOTS]))

    async def load(self, name: str) -> bytes | None:
        """The last snapshot saved under ``name``, or None."""
        async with self._db.execute(
            "SELECT data FROM actor_snapshots WHERE name = ?", (name,)
        ) as cur:
            row = await cur.fetchone()
        return bytes(row[0]) if row else None

    async def load_as(self, name: str, shape: type[T]) -> T | None:
        """The last snapshot of ``name`` decoded as ``shape``; None when there is none, or
        when it no longer decodes (logged: a snapshot of an older shape must not stop the
        actor from starting)."""
        raw = await self.load(name)
        if raw is None:
            return None
        try:
            return msgspec.json.decode(raw, type=shape)
        except msgspec.DecodeError:
            logger.warning("ignoring unreadable snapshot of %s", name)
            return None

    async def save(self, name: str, data: bytes, now: float, *, durable: bool = False) -> None:
        """Replace the snapshot of ``name``. Here every save is stored on return; a store
        that writes behind (the cluster's) waits for the write only when ``durable`` (an
        operator's command, which answers once its change is stored)."""
        await self._db.execute(
            "INSERT INTO actor_snapshots (name, data, updated) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET data = excluded.data, updated = excluded.updated",
            (name, data, now),
        )
        await self._db.commit()

    async def aclose(self) -> None:
        """Close the connection."""
        await self._db.close()
