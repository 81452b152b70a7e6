"""Where the request log and the spend aggregates are kept: the seam the StoreActor writes
through, with one implementation per database (``log_sqlite``, ``log_postgres``).

Both run the same statements (``request_log``, ``spend_report``, ``log_aggregates``), written
with ``?`` placeholders; PostgreSQL gets them numbered (:func:`numbered`). Only the schema
differs by dialect. A batch is committed once whichever database holds it: each
implementation writes a batch's rows, their hourly spend and its sender's last ``seq`` in
one transaction (:func:`take_fresh` decides which batches are new), so a batch sent again
after its answer was lost is recognised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.stores.request_log import Row
    from schemas.config import DatabaseConfig


class LogStorageError(Exception):
    """A statement failed or the database cannot be reached; what the statement wrote was
    rolled back. The message names no password."""


class LogBatch(Protocol):
    """One ``LogAppend`` as stored: its sender, its number and its rows."""

    @property
    def sender(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def rows(self) -> list[Row]: ...


B = TypeVar("B", bound=LogBatch)


class LogStorage(Protocol):
    """The request log's tables in one database, opened by their one owner (the
    StoreActor). Every method raises LogStorageError."""

    def describe(self) -> str:
        """Where the tables are, for logs (a URL without its password)."""
        ...

    async def open(self) -> None:
        """Connect, then create or bring up to date the tables and indices."""
        ...

    async def append(self, batches: Sequence[B], now: float) -> list[B]:
        """Commit the ``batches`` not committed before (by ``seq`` per sender) with their
        spend aggregates and their senders' last ``seq`` (at ``now``) in one transaction;
        the batches written."""
        ...

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        """The rows of one SELECT (``?`` placeholders)."""
        ...

    async def prune(self, cutoff: float) -> int:
        """Delete rows, aggregates and senders older than ``cutoff`` (epoch seconds); how
        many log rows went."""
        ...

    async def close(self) -> None:
        """Release the connection(s); raises nothing."""
        ...


def take_fresh(batches: Sequence[B], last: dict[str, int]) -> list[B]:
    """The batches newer than their sender's ``last`` committed seq, advancing ``last``."""
    fresh = []
    for b in batches:
        if b.seq > last.get(b.sender, 0):  # a sender sends seq + 1 only once seq is answered
            last[b.sender] = b.seq
            fresh.append(b)
    return fresh


def numbered(sql: str) -> str:
    """``sql`` with its ``?`` placeholders as PostgreSQL's ``$1``, ``$2``, ... (the shared
    statements hold no ``?`` inside a literal)."""
    parts = sql.split("?")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        out.append(f"${i}{part}")
    return "".join(out)


def log_storage(database: DatabaseConfig) -> LogStorage:
    """The storage ``database`` names: PostgreSQL at ``url`` when set, else the SQLite file
    at ``path``. Not opened yet."""
    if database.url:
        # Imported here only: asyncpg is needed by deployments that configure PostgreSQL.
        from actors.stores.log_postgres import PostgresLogStorage

        return PostgresLogStorage(database.url)
    from actors.stores.log_sqlite import SqliteLogStorage

    return SqliteLogStorage(database.path)
