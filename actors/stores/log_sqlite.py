"""The request log in the shared SQLite file (``database.path``; the embedded default).

One connection (aiosqlite, WAL, synchronous=NORMAL: a commit survives a crash of the process).
A file from before the cost columns or the spend aggregates is brought up to date at open.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from actors.stores.db import open_db
from actors.stores.log_storage import B, LogStorageError, take_fresh
from actors.stores.request_log import (
    INSERT,
    LOG_SENDERS,
    PRUNE,
    PRUNE_SENDERS,
    REQUEST_LOG,
    SENDER_SEQ,
    SENDER_UPSERT,
    TABLE_INFO,
    missing_columns,
)
from actors.stores.spend_report import (
    BACKFILL,
    HOUR_S,
    PRUNE_HOURLY,
    SPEND_HOURLY,
    UPSERT,
    hourly_upserts,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import aiosqlite

    from actors.stores.request_log import Row


class SqliteLogStorage:
    """The log's tables in the SQLite file at ``path``; a LogStorage."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._db: aiosqlite.Connection | None = None

    def describe(self) -> str:
        return f"SQLite {self._path}"

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise LogStorageError("the request log's database is not open")
        return self._db

    async def open(self) -> None:
        try:
            self._db = await open_db(self._path, [REQUEST_LOG, LOG_SENDERS])
            await self._upgrade(self._db)
        except sqlite3.Error as exc:
            await self.close()
            raise LogStorageError(f"{self.describe()}: {exc}") from None

    @staticmethod
    async def _upgrade(db: aiosqlite.Connection) -> None:
        """Bring a file from before the cost columns and the spend aggregates up to date."""
        async with db.execute(TABLE_INFO) as cur:
            present = {str(r[0]) for r in await cur.fetchall()}
        for stmt in missing_columns(present):
            await db.execute(stmt)
        async with db.execute("SELECT name FROM sqlite_master WHERE name = 'spend_hourly'") as cur:
            had_aggregates = await cur.fetchone() is not None
        for stmt in SPEND_HOURLY.statements:
            await db.execute(stmt)
        if not had_aggregates:
            await db.execute(BACKFILL)
        await db.commit()

    async def append(self, batches: Sequence[B], now: float) -> list[B]:
        db = self._conn()
        try:
            last: dict[str, int] = {}
            for sender in {b.sender for b in batches}:
                async with db.execute(SENDER_SEQ, (sender,)) as cur:
                    found = await cur.fetchone()
                last[sender] = int(found[0]) if found else 0
            fresh = take_fresh(batches, last)
            rows = [row for b in fresh for row in b.rows]
            await db.executemany(INSERT, rows)
            await db.executemany(UPSERT, hourly_upserts(rows))
            await db.executemany(SENDER_UPSERT, [(s, q, now) for s, q in last.items()])
            await db.commit()
        except (sqlite3.Error, OverflowError, ValueError, TypeError) as exc:
            # All or nothing: the batches come again, and must not find half of them here.
            # A value the driver cannot bind (OverflowError, ...) is a failed write too, never
            # the actor's crash (the StoreActor leaves such rows out before they get here).
            await db.rollback()
            raise LogStorageError(f"{type(exc).__name__}: {exc}") from None
        return fresh

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        try:
            async with self._conn().execute(sql, tuple(params)) as cur:
                return [tuple(r) for r in await cur.fetchall()]
        except sqlite3.Error as exc:
            raise LogStorageError(str(exc)) from None

    async def prune(self, cutoff: float) -> int:
        db = self._conn()
        try:
            cur = await db.execute(PRUNE, (cutoff,))
            await db.execute(PRUNE_HOURLY, (int(cutoff // HOUR_S),))
            await db.execute(PRUNE_SENDERS, (cutoff,))
            await db.commit()
        except sqlite3.Error as exc:
            await db.rollback()
            raise LogStorageError(str(exc)) from None
        return max(cur.rowcount, 0)

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()
