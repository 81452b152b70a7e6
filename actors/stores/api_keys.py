"""Gateway API keys in the shared SQLite file: organisations, users, hashed keys.

A key is ``llmgw-`` plus 43 random URL-safe characters, shown once at creation; the database
keeps only its sha256 hex (``key_hash``) and a short display prefix. Each key belongs to a
user of an organisation (both created on first use) and carries a role; it may expire, and
revoking keeps the row (so "a key exists" stays true and the revocation is auditable).
Only the ApiKeyAdminActor opens this table while a gateway runs (ingresses ask it over the bus);
``llmgw keys`` uses the same store directly only when no gateway answers (the first admin key).
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from actors.stores.db import Migration
from schemas.keys import (
    ApiKeyInfo,
    expiry_problem,
    hash_key,
    parse_duration,
    parse_instant,
    role_rank,
)
from schemas.limits import key_owner_problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.stores.provider_keys import LazyDb

__all__ = [
    "API_KEYS",
    "KEY_PREFIX",
    "ApiKeyRecord",
    "ApiKeyStore",
    "ApiKeys",
    "hash_key",
    "new_key",
    "parse_duration",
    "parse_instant",
]

KEY_PREFIX = "llmgw-"

API_KEYS = Migration(
    "api_keys",
    (
        "CREATE TABLE IF NOT EXISTS orgs (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " name TEXT NOT NULL UNIQUE, created REAL NOT NULL)",
        "CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " org_id INTEGER NOT NULL REFERENCES orgs(id), name TEXT NOT NULL,"
        " created REAL NOT NULL, UNIQUE (org_id, name))",
        "CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY,"
        " key_hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,"
        " user_id INTEGER NOT NULL REFERENCES users(id), role TEXT NOT NULL,"
        " name TEXT NOT NULL DEFAULT '', created REAL NOT NULL, expires REAL, revoked REAL)",
    ),
)


def new_key() -> str:
    """A fresh high-entropy gateway API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """One key's row (never the key itself)."""

    id: str
    key_hash: str
    prefix: str
    org: str
    user: str
    role: str
    name: str
    created: float
    expires: float | None
    revoked: float | None

    def status(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= now:
            return "expired"
        return "active"

    def info(self) -> ApiKeyInfo:
        """What an ingress needs to admit a caller with this key (no hash, no key)."""
        return ApiKeyInfo(
            found=True,
            key_id=self.id,
            role=self.role,
            org=self.org,
            user=self.user,
            expires=self.expires,
            revoked=self.revoked,
        )

    def public(self, now: float) -> dict[str, Any]:
        """A JSON-able view for listings (no hash)."""
        out = asdict(self)
        del out["key_hash"]
        out["status"] = self.status(now)
        return out


_SELECT = (
    "SELECT k.id, k.key_hash, k.prefix, o.name, u.name, k.role, k.name, k.created, k.expires,"
    " k.revoked FROM api_keys k JOIN users u ON u.id = k.user_id JOIN orgs o ON o.id = u.org_id"
)


def _record(row: Sequence[Any]) -> ApiKeyRecord:
    return ApiKeyRecord(*row)


class ApiKeys(ABC):
    """Where the gateway API keys are kept: :class:`ApiKeyStore` (the SQLite file) or
    ``api_keys_snapshot.SnapshotApiKeyStore`` (a cluster). Creates, finds, lists and
    revokes keys; raises what its storage raises, ValueError for an unknown role or an
    empty org/user name."""

    async def create(
        self,
        *,
        org: str,
        user: str,
        role: str,
        now: float,
        name: str = "",
        expires: float | None = None,
    ) -> tuple[str, ApiKeyRecord]:
        """A new key for ``user`` of ``org`` (both created if missing): (the key, its row).

        The key is returned here only; it cannot be recovered later.
        """
        role_rank(role)
        if not org.strip() or not user.strip():
            raise ValueError("org and user must be non-empty")
        problem = key_owner_problem(org, user)
        if problem is not None:
            raise ValueError(problem[1])
        expired = expiry_problem(expires, now)
        if expired is not None:
            raise ValueError(expired)
        key = new_key()
        record = ApiKeyRecord(
            id="gk-" + secrets.token_hex(6),
            key_hash=hash_key(key),
            prefix=key[: len(KEY_PREFIX) + 6],
            org=org,
            user=user,
            role=role,
            name=name,
            created=now,
            expires=expires,
            revoked=None,
        )
        return key, await self._add(record)

    @abstractmethod
    async def _add(self, record: ApiKeyRecord) -> ApiKeyRecord:
        """Keep the new ``record``; the row as kept."""

    @abstractmethod
    async def any_keys(self) -> bool:
        """Whether any key was ever created (revoked ones count: auth stays on)."""

    @abstractmethod
    async def lookup(self, key_hash: str) -> ApiKeyRecord | None:
        """The key whose hash is ``key_hash``."""

    @abstractmethod
    async def lookup_id(self, key_id: str) -> ApiKeyRecord | None:
        """The key whose id is ``key_id``."""

    @abstractmethod
    async def records(self) -> list[ApiKeyRecord]:
        """Every key, oldest first."""

    @abstractmethod
    async def revoke(self, ref: str, now: float) -> ApiKeyRecord | None:
        """Revoke the key whose id is ``ref`` (or which is ``ref`` itself); None if unknown.
        Revoking twice keeps the first revocation time."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the storage holds."""


class ApiKeyStore(ApiKeys):
    """The gateway API keys in the shared SQLite file. Raises sqlite3.Error on storage
    failure, ValueError for an unknown role or an empty org/user name."""

    def __init__(self, db: LazyDb) -> None:
        self.db = db

    async def any_keys(self) -> bool:
        """Whether any key was ever created (revoked ones count: auth stays on)."""
        conn = await self.db.get(create=False)
        if conn is None:
            return False
        async with conn.execute("SELECT 1 FROM api_keys LIMIT 1") as cur:
            return await cur.fetchone() is not None

    async def lookup(self, key_hash: str) -> ApiKeyRecord | None:
        """The key whose hash is ``key_hash``."""
        conn = await self.db.get(create=False)
        if conn is None:
            return None
        async with conn.execute(_SELECT + " WHERE k.key_hash = ?", (key_hash,)) as cur:
            row = await cur.fetchone()
        return _record(row) if row else None

    async def lookup_id(self, key_id: str) -> ApiKeyRecord | None:
        """The key whose id is ``key_id``."""
        conn = await self.db.get(create=False)
        if conn is None:
            return None
        async with conn.execute(_SELECT + " WHERE k.id = ?", (key_id,)) as cur:
            row = await cur.fetchone()
        return _record(row) if row else None

    async def records(self) -> list[ApiKeyRecord]:
        """Every key, oldest first."""
        conn = await self.db.get(create=False)
        if conn is None:
            return []
        async with conn.execute(_SELECT + " ORDER BY k.created, k.id") as cur:
            return [_record(r) for r in await cur.fetchall()]

    async def _add(self, record: ApiKeyRecord) -> ApiKeyRecord:
        conn = await self.db.get(create=True)
        assert conn is not None
        org, user, now = record.org, record.user, record.created
        await conn.execute("INSERT OR IGNORE INTO orgs (name, created) VALUES (?, ?)", (org, now))
        await conn.execute(
            "INSERT OR IGNORE INTO users (org_id, name, created)"
            " SELECT id, ?, ? FROM orgs WHERE name = ?",
            (user, now, org),
        )
        await conn.execute(
            "INSERT INTO api_keys (id, key_hash, prefix, user_id, role, name, created, expires)"
            " SELECT ?, ?, ?, u.id, ?, ?, ?, ? FROM users u JOIN orgs o ON o.id = u.org_id"
            " WHERE o.name = ? AND u.name = ?",
            (
                record.id,
                record.key_hash,
                record.prefix,
                record.role,
                record.name,
                now,
                record.expires,
                org,
                user,
            ),
        )
        await conn.commit()
        found = await self.lookup(record.key_hash)
        assert found is not None
        return found

    async def revoke(self, ref: str, now: float) -> ApiKeyRecord | None:
        """Revoke the key whose id is ``ref`` (or which is ``ref`` itself); None if unknown.
        Revoking twice keeps the first revocation time."""
        conn = await self.db.get(create=False)
        if conn is None:
            return None
        column, value = ("key_hash", hash_key(ref)) if ref.startswith(KEY_PREFIX) else ("id", ref)
        await conn.execute(
            f"UPDATE api_keys SET revoked = ? WHERE {column} = ? AND revoked IS NULL", (now, value)
        )
        await conn.commit()
        async with conn.execute(_SELECT + f" WHERE k.{column} = ?", (value,)) as cur:
            row = await cur.fetchone()
        return _record(row) if row else None

    async def aclose(self) -> None:
        """Close the database connection if open."""
        await self.db.aclose()
