"""The request log in PostgreSQL (``database.url``), where every actor host can reach it.

asyncpg, imported only by deployments that configure it. The tables have the SQLite file's
columns (``request_log``, ``spend_hourly``, ``log_senders``), with 64-bit numbers and double
precision where SQLite's types are dynamic; they are created (or given the columns added
since) at open, under an advisory lock so two hosts starting at once do not race. A batch is
committed in one transaction that first locks its senders' rows (``FOR UPDATE``), so two
stores given the same batch (a takeover, a reload) commit it once.
"""

from __future__ import annotations

import decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

from actors.stores.log_storage import B, LogStorageError, numbered, take_fresh
from actors.stores.request_log import (
    ADDED_COLUMNS,
    INSERT,
    PRUNE,
    PRUNE_SENDERS,
    SENDER_UPSERT,
)
from actors.stores.spend_report import HOUR_S, PRUNE_HOURLY, UPSERT, hourly_upserts

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.stores.request_log import Row

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS request_log ("
    " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ts DOUBLE PRECISION NOT NULL,"
    " kind TEXT NOT NULL, request_id TEXT NOT NULL, caller_id TEXT NOT NULL,"
    " org TEXT NOT NULL, surface TEXT NOT NULL, requested_model TEXT NOT NULL,"
    " model TEXT NOT NULL, endpoint TEXT NOT NULL, credential_id TEXT NOT NULL,"
    " status INTEGER, outcome TEXT NOT NULL, error_kind TEXT NOT NULL,"
    " fallback INTEGER NOT NULL, attempt INTEGER NOT NULL, ttft_ms DOUBLE PRECISION,"
    " latency_ms DOUBLE PRECISION NOT NULL, prompt_tokens BIGINT NOT NULL,"
    " completion_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL,"
    " stream INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS request_log_ts ON request_log (ts)",
    "CREATE INDEX IF NOT EXISTS request_log_request ON request_log (request_id)",
    "CREATE TABLE IF NOT EXISTS spend_hourly ("
    " hour BIGINT NOT NULL, key_id TEXT NOT NULL, user_id TEXT NOT NULL,"
    " org TEXT NOT NULL, model TEXT NOT NULL, requests BIGINT NOT NULL,"
    " prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL,"
    " cost_usd DOUBLE PRECISION NOT NULL, estimated_requests BIGINT NOT NULL,"
    " PRIMARY KEY (hour, key_id, user_id, org, model))",
    "CREATE TABLE IF NOT EXISTS log_senders ("
    " sender TEXT PRIMARY KEY, seq BIGINT NOT NULL, ts DOUBLE PRECISION NOT NULL)",
    *(
        f"ALTER TABLE request_log ADD COLUMN IF NOT EXISTS {name} "
        + decl.replace("REAL", "DOUBLE PRECISION")
        for name, decl in ADDED_COLUMNS.items()
    ),
)
_SCHEMA_LOCK = 0x6C6C_6D67_7700_0001  # pg_advisory_xact_lock key: llmgw's request log schema
_NEW_SENDER = (
    "INSERT INTO log_senders (sender, seq, ts) VALUES ($1, 0, $2) ON CONFLICT (sender) DO NOTHING"
)
_LOCK_SENDERS = "SELECT sender, seq FROM log_senders WHERE sender = ANY($1::text[]) FOR UPDATE"
_INSERT, _UPSERT, _SENDER_UPSERT = (numbered(s) for s in (INSERT, UPSERT, SENDER_UPSERT))
_POOL_MAX = 4  # one writer (the owner's lock), the rest for queries meanwhile
_CONNECT_TIMEOUT_S = 10.0
# What a statement or a lost connection raises; turned into LogStorageError. A connection
# the server ended while idle can fail its next use with an InternalClientError.
DRIVER_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


def display_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` and its query left out (it may carry
    one too), for logs and messages."""
    parts = urlsplit(url)
    user = parts.username or ""
    if user and parts.password:
        user += ":***"
    user = f"{user}@" if user else ""
    return f"{parts.scheme}://{user}{parts.netloc.rpartition('@')[2]}{parts.path}"


def plain(row: asyncpg.Record) -> Row:
    """A record as a tuple of Python numbers (a SUM of integers is NUMERIC: an int here)."""
    return tuple(
        (int(v) if v == v.to_integral_value() else float(v))
        if isinstance(v, decimal.Decimal)
        else v
        for v in row.values()
    )


class PostgresLogStorage:
    """The log's tables in the PostgreSQL database at ``url``; a LogStorage."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._pool: asyncpg.Pool | None = None

    def describe(self) -> str:
        return f"PostgreSQL {display_url(self._url)}"

    def _error(self, exc: Exception) -> LogStorageError:
        # asyncpg's messages name the host and user at most; the DSN itself never.
        return LogStorageError(f"{self.describe()}: {type(exc).__name__}: {exc}")

    def _connected(self) -> asyncpg.Pool:
        if self._pool is None:
            raise LogStorageError("the request log's database is not open")
        return self._pool

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self._url, min_size=1, max_size=_POOL_MAX, timeout=_CONNECT_TIMEOUT_S
            )
            async with self._pool.acquire() as con, con.transaction():
                await con.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                for stmt in _SCHEMA:
                    await con.execute(stmt)
        except DRIVER_ERRORS as exc:
            await self.close()
            raise self._error(exc) from None

    async def append(self, batches: Sequence[B], now: float) -> list[B]:
        senders = sorted({b.sender for b in batches})  # one order: no deadlock between stores
        try:
            async with self._connected().acquire() as con, con.transaction():
                await con.executemany(_NEW_SENDER, [(s, now) for s in senders])
                locked = await con.fetch(_LOCK_SENDERS, senders)
                last = {str(r["sender"]): int(r["seq"]) for r in locked}
                fresh = take_fresh(batches, last)
                rows = [row for b in fresh for row in b.rows]
                if rows:
                    await con.executemany(_INSERT, rows)
                    hourly = hourly_upserts(rows)
                    if hourly:
                        await con.executemany(_UPSERT, hourly)
                await con.executemany(_SENDER_UPSERT, [(s, q, now) for s, q in last.items()])
        except DRIVER_ERRORS as exc:  # the transaction rolled back as it left
            raise self._error(exc) from None
        return fresh

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        try:
            async with self._connected().acquire() as con:
                return [plain(r) for r in await con.fetch(numbered(sql), *params)]
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None

    async def prune(self, cutoff: float) -> int:
        try:
            async with self._connected().acquire() as con, con.transaction():
                status = await con.execute(numbered(PRUNE), cutoff)
                await con.execute(numbered(PRUNE_HOURLY), int(cutoff // HOUR_S))
                await con.execute(numbered(PRUNE_SENDERS), cutoff)
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None
        return int(str(status).rsplit(" ", 1)[-1] or 0)  # "DELETE <n>"

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except DRIVER_ERRORS:
                pool.terminate()
