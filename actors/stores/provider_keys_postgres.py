"""Provider keys in PostgreSQL (``database.url``), for a cluster of actors hosts.

The ``keys`` unit moves between hosts on a takeover, and the host taking it over must know
every key an operator added: the tables of the SQLite store (same columns, same statements)
live in the PostgreSQL database every host of a cluster already shares for the request log.
Not in JetStream: any NATS user allowed to read ``$JS`` could read a snapshot bucket, while
this database is reached only with its own credentials. The secrets are stored as given, as in
the SQLite file (the gateway must send them upstream): the database is as sensitive as the
config. asyncpg never logs a statement's parameters.

Tables are created at first use under an advisory lock (two hosts starting at once). Raises
SharedDatabaseError (naming the database, never its password) when a statement fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

from actors.stores.db import SharedDatabaseError
from actors.stores.log_postgres import DRIVER_ERRORS, display_url
from actors.stores.log_storage import numbered
from actors.stores.provider_keys import (
    ADOPT_KEY,
    ADOPT_RESERVATION,
    DELETE_KEY,
    DELETE_RESERVATION,
    INSERT_KEY,
    SELECT_KEY,
    SELECT_KEYS,
    SELECT_RESERVATIONS,
    SELECT_SECRET,
    UPDATE_ROLE,
    UPSERT_RESERVATION,
    decl_of,
    decl_row,
    new_decl,
)
from schemas.keys import role_rank

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas.keys import ProviderKeyDecl

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS provider_api_keys (id TEXT PRIMARY KEY,"
    " credential_id TEXT NOT NULL, secret TEXT NOT NULL, endpoint TEXT NOT NULL DEFAULT '',"
    " base_url TEXT NOT NULL DEFAULT '', min_role TEXT NOT NULL DEFAULT 'free',"
    " created DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS provider_env_key_min_roles ("
    " credential_id TEXT PRIMARY KEY, min_role TEXT NOT NULL,"
    " updated DOUBLE PRECISION NOT NULL)",
)
_SCHEMA_LOCK = 0x6C6C_6D67_7700_0002  # pg_advisory_xact_lock key: llmgw's provider keys schema
_POOL_MAX = 2  # one owner: a command at a time, and a grant meanwhile
_CONNECT_TIMEOUT_S = 10.0


class PostgresProviderKeyStore:
    """Reads and writes provider keys and reservations in the database at ``url``; the
    SQLite ProviderKeyStore's methods. Raises SharedDatabaseError on storage failure,
    ValueError for an unknown role."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._pool: asyncpg.Pool | None = None

    async def _connected(self) -> asyncpg.Pool:
        if self._pool is None:
            pool = await asyncpg.create_pool(
                self._url, min_size=1, max_size=_POOL_MAX, timeout=_CONNECT_TIMEOUT_S
            )
            try:
                async with pool.acquire() as con, con.transaction():
                    await con.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                    for stmt in _SCHEMA:
                        await con.execute(stmt)
            except BaseException:
                pool.terminate()
                raise
            self._pool = pool
        return self._pool

    def _error(self, exc: Exception) -> SharedDatabaseError:
        # asyncpg's messages name the host and user at most; the DSN and parameters never.
        where = display_url(self._url)
        return SharedDatabaseError(f"PostgreSQL {where}: {type(exc).__name__}: {exc}")

    async def declarations(self) -> tuple[tuple[ProviderKeyDecl, ...], dict[str, str]]:
        """(database keys in creation order, reservations by credential id)."""
        try:
            async with (await self._connected()).acquire() as con:
                keys = tuple(decl_of(tuple(r.values())) for r in await con.fetch(SELECT_KEYS))
                rows = await con.fetch(SELECT_RESERVATIONS)
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None
        return keys, {str(r["credential_id"]): str(r["min_role"]) for r in rows}

    async def secret(self, cid: str) -> str | None:
        """The secret of the database key whose credential id is ``cid`` (None: no such key).
        For the KeyRegistryActor's grants only; never logged."""
        try:
            async with (await self._connected()).acquire() as con:
                value = await con.fetchval(numbered(SELECT_SECRET), cid)
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None
        return None if value is None else str(value)

    async def add(
        self, secret: str, *, endpoint: str, base_url: str, min_role: str, now: float
    ) -> ProviderKeyDecl:
        """Store a new key; returns its declaration (never the secret)."""
        decl = new_decl(secret, endpoint=endpoint, base_url=base_url, min_role=min_role, now=now)
        await self._execute(INSERT_KEY, *decl_row(decl, secret))
        return decl

    async def set_min_role(self, key_id: str, min_role: str) -> ProviderKeyDecl | None:
        """Change a database key's tier; None when there is no such key."""
        role_rank(min_role)
        try:
            async with (await self._connected()).acquire() as con, con.transaction():
                await con.execute(numbered(UPDATE_ROLE), min_role, key_id)
                row = await con.fetchrow(numbered(SELECT_KEY), key_id)
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None
        return None if row is None else decl_of(tuple(row.values()))

    async def delete(self, key_id: str) -> bool:
        """Remove a database key; False when there was none."""
        status = await self._execute(DELETE_KEY, key_id)
        return status != "DELETE 0"

    async def reserve(self, cid: str, min_role: str, now: float) -> None:
        """Reserve credential ``cid`` for ``min_role`` and above (``free`` lifts it)."""
        role_rank(min_role)
        if min_role == "free":
            await self._execute(DELETE_RESERVATION, cid)
        else:
            await self._execute(UPSERT_RESERVATION, cid, min_role, now)

    async def adopt(
        self, keys: Sequence[Sequence[object]], reservations: Sequence[Sequence[object]]
    ) -> None:
        """Insert ``keys`` (INSERT_KEY's parameters) and ``reservations``
        (UPSERT_RESERVATION's) in one transaction, each only where this database has no row of
        that key id or credential id: what is here is the cluster's newer word."""
        try:
            async with (await self._connected()).acquire() as con, con.transaction():
                await con.executemany(numbered(ADOPT_KEY), [tuple(k) for k in keys])
                await con.executemany(numbered(ADOPT_RESERVATION), [tuple(r) for r in reservations])
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None

    async def _execute(self, sql: str, *params: object) -> str:
        try:
            async with (await self._connected()).acquire() as con:
                return str(await con.execute(numbered(sql), *params))
        except DRIVER_ERRORS as exc:
            raise self._error(exc) from None

    async def aclose(self) -> None:
        """Close the connections if open."""
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except DRIVER_ERRORS:
                pool.terminate()
