"""Provider keys in the SQLite file: database-added keys and reservations by hash.

- ``provider_api_keys``: keys added through ``POST /admin/provider-keys``; each joins the pools
  of one endpoint id or of every route with one base URL, after the configured keys, in
  creation order, with its own ``min_role``. The secret is stored as given (the gateway must
  send it upstream), so the database file is as sensitive as the config: keep it 0600.
- ``provider_env_key_min_roles``: reservations of environment or config keys, keyed by the
  key's credential id (a hash), so a reservation outlives the key leaving rotation.

The database is opened lazily: a process that never needs it never creates the file. The
statements are shared with the PostgreSQL store a cluster uses (``provider_keys_postgres``).
"""

from __future__ import annotations

import secrets as _secrets
from typing import TYPE_CHECKING

import anyio

from actors.stores.db import Migration, open_db
from schemas.config import credential_id
from schemas.keys import ProviderKeyDecl, role_rank

if TYPE_CHECKING:
    from collections.abc import Sequence

    import aiosqlite

PROVIDER_KEYS = Migration(
    "provider_keys",
    (
        "CREATE TABLE IF NOT EXISTS provider_api_keys (id TEXT PRIMARY KEY,"
        " credential_id TEXT NOT NULL, secret TEXT NOT NULL, endpoint TEXT NOT NULL DEFAULT '',"
        " base_url TEXT NOT NULL DEFAULT '', min_role TEXT NOT NULL DEFAULT 'free',"
        " created REAL NOT NULL)",
        "CREATE TABLE IF NOT EXISTS provider_env_key_min_roles ("
        " credential_id TEXT PRIMARY KEY, min_role TEXT NOT NULL, updated REAL NOT NULL)",
    ),
)


class _Unlogged(str):
    """A secret as an SQL parameter: aiosqlite's DEBUG log prints parameters with repr()."""

    def __repr__(self) -> str:
        return "'[secret]'"


class LazyDb:
    """One connection to the shared SQLite file, opened (with ``migrations``) on first need."""

    def __init__(self, path: str, migrations: Sequence[Migration]) -> None:
        self.path = path
        self._migrations = tuple(migrations)
        self._conn: aiosqlite.Connection | None = None
        self._lock = anyio.Lock()

    async def get(self, *, create: bool) -> aiosqlite.Connection | None:
        """The connection; None when the file does not exist and ``create`` is False.

        Raises sqlite3.Error when the file cannot be opened.
        """
        if self._conn is not None:
            return self._conn
        async with self._lock:
            if self._conn is None:
                file = None if self.path == ":memory:" else anyio.Path(self.path)
                if not create and file is not None and not await file.exists():
                    return None
                self._conn = await open_db(self.path, self._migrations)  # created 0600
        return self._conn

    async def aclose(self) -> None:
        """Close the connection if open."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def decl_of(row: Sequence[object]) -> ProviderKeyDecl:
    """A declaration from a row of ``_COLUMNS``."""
    key_id, cid, endpoint, base_url, min_role, created = row
    return ProviderKeyDecl(
        key_id=str(key_id),
        credential_id=str(cid),
        endpoint=str(endpoint),
        base_url=str(base_url),
        min_role=str(min_role),
        created=float(created),  # type: ignore[arg-type]
    )


_COLUMNS = "id, credential_id, endpoint, base_url, min_role, created"
SELECT_KEYS = f"SELECT {_COLUMNS} FROM provider_api_keys ORDER BY created, id"
SELECT_KEY = f"SELECT {_COLUMNS} FROM provider_api_keys WHERE id = ?"
SELECT_RESERVATIONS = "SELECT credential_id, min_role FROM provider_env_key_min_roles"
SELECT_KEY_ROWS = (
    "SELECT id, credential_id, secret, endpoint, base_url, min_role, created"
    " FROM provider_api_keys ORDER BY created, id"
)
SELECT_RESERVATION_ROWS = "SELECT credential_id, min_role, updated FROM provider_env_key_min_roles"
SELECT_SECRET = (
    "SELECT secret FROM provider_api_keys WHERE credential_id = ? ORDER BY created LIMIT 1"
)
INSERT_KEY = (
    "INSERT INTO provider_api_keys (id, credential_id, secret, endpoint, base_url,"
    " min_role, created) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
ADOPT_KEY = INSERT_KEY + " ON CONFLICT (id) DO NOTHING"
ADOPT_RESERVATION = (
    "INSERT INTO provider_env_key_min_roles (credential_id, min_role, updated)"
    " VALUES (?, ?, ?) ON CONFLICT (credential_id) DO NOTHING"
)
UPDATE_ROLE = "UPDATE provider_api_keys SET min_role = ? WHERE id = ?"
DELETE_KEY = "DELETE FROM provider_api_keys WHERE id = ?"
DELETE_RESERVATION = "DELETE FROM provider_env_key_min_roles WHERE credential_id = ?"
UPSERT_RESERVATION = (
    "INSERT INTO provider_env_key_min_roles (credential_id, min_role, updated)"
    " VALUES (?, ?, ?) ON CONFLICT(credential_id) DO UPDATE SET"
    " min_role = excluded.min_role, updated = excluded.updated"
)


def new_decl(
    secret: str, *, endpoint: str, base_url: str, min_role: str, now: float
) -> ProviderKeyDecl:
    """The declaration of a key being added (a fresh id). Raises ValueError for an unknown
    role."""
    role_rank(min_role)
    return ProviderKeyDecl(
        key_id="pk-" + _secrets.token_hex(6),
        credential_id=credential_id(secret),
        endpoint=endpoint,
        base_url=base_url.rstrip("/"),
        min_role=min_role,
        created=now,
    )


def decl_row(decl: ProviderKeyDecl, secret: object) -> tuple[object, ...]:
    """INSERT_KEY's parameters for ``decl`` and its ``secret``."""
    return (
        decl.key_id,
        decl.credential_id,
        secret,
        decl.endpoint,
        decl.base_url,
        decl.min_role,
        decl.created,
    )


class ProviderKeyStore:
    """Reads and writes provider keys and reservations. Raises sqlite3.Error on storage
    failure; ValueError for an unknown role."""

    def __init__(self, db: LazyDb) -> None:
        self.db = db

    async def declarations(self) -> tuple[tuple[ProviderKeyDecl, ...], dict[str, str]]:
        """(database keys in creation order, reservations by credential id)."""
        conn = await self.db.get(create=False)
        if conn is None:
            return (), {}
        async with conn.execute(SELECT_KEYS) as cur:
            keys = tuple(decl_of(row) for row in await cur.fetchall())
        async with conn.execute(SELECT_RESERVATIONS) as cur:
            reservations = {str(cid): str(role) for cid, role in await cur.fetchall()}
        return keys, reservations

    async def secret(self, cid: str) -> str | None:
        """The secret of the database key whose credential id is ``cid`` (None: no such key).
        For the KeyRegistryActor's grants only; never logged."""
        conn = await self.db.get(create=False)
        if conn is None:
            return None
        async with conn.execute(SELECT_SECRET, (cid,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def add(
        self, secret: str, *, endpoint: str, base_url: str, min_role: str, now: float
    ) -> ProviderKeyDecl:
        """Store a new key; returns its declaration (never the secret)."""
        decl = new_decl(secret, endpoint=endpoint, base_url=base_url, min_role=min_role, now=now)
        conn = await self.db.get(create=True)
        assert conn is not None
        await conn.execute(INSERT_KEY, decl_row(decl, _Unlogged(secret)))
        await conn.commit()
        return decl

    async def set_min_role(self, key_id: str, min_role: str) -> ProviderKeyDecl | None:
        """Change a database key's tier; None when there is no such key."""
        role_rank(min_role)
        conn = await self.db.get(create=True)
        assert conn is not None
        await conn.execute(UPDATE_ROLE, (min_role, key_id))
        await conn.commit()
        async with conn.execute(SELECT_KEY, (key_id,)) as cur:
            row = await cur.fetchone()
        return decl_of(row) if row else None

    async def delete(self, key_id: str) -> bool:
        """Remove a database key; False when there was none."""
        conn = await self.db.get(create=True)
        assert conn is not None
        cur = await conn.execute(DELETE_KEY, (key_id,))
        await conn.commit()
        return (cur.rowcount or 0) > 0

    async def reserve(self, cid: str, min_role: str, now: float) -> None:
        """Reserve credential ``cid`` for ``min_role`` and above (``free`` lifts it)."""
        role_rank(min_role)
        conn = await self.db.get(create=True)
        assert conn is not None
        if min_role == "free":
            await conn.execute(DELETE_RESERVATION, (cid,))
        else:
            await conn.execute(UPSERT_RESERVATION, (cid, min_role, now))
        await conn.commit()

    async def rows(self) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        """Every key as INSERT_KEY's parameters (the secret included: for moving the keys to
        the cluster's database only, never logged) and every reservation as
        UPSERT_RESERVATION's; empty when the file does not exist."""
        conn = await self.db.get(create=False)
        if conn is None:
            return [], []
        async with conn.execute(SELECT_KEY_ROWS) as cur:
            keys = [(r[0], r[1], _Unlogged(r[2]), *r[3:]) for r in await cur.fetchall()]
        async with conn.execute(SELECT_RESERVATION_ROWS) as cur:
            reservations = [tuple(r) for r in await cur.fetchall()]
        return keys, reservations

    async def forget(self, key_ids: Sequence[str], cids: Sequence[str]) -> None:
        """Remove the keys ``key_ids`` and the reservations of ``cids``, in one transaction."""
        conn = await self.db.get(create=False)
        if conn is None:
            return
        await conn.executemany(DELETE_KEY, [(k,) for k in key_ids])
        await conn.executemany(DELETE_RESERVATION, [(c,) for c in cids])
        await conn.commit()

    async def aclose(self) -> None:
        """Close the file if open."""
        await self.db.aclose()
