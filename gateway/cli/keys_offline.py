"""``llmgw keys`` with no gateway running: the one CLI path that writes the keys' table itself.

The ApiKeyAdminActor owns the gateway API keys; while a gateway runs, ``llmgw keys`` sends it
admin commands (``gateway.cli.keys``). The first admin key, though, must be made before any
gateway (or admin key) exists, so when no gateway answers the command runs here, on the
database file of ``--db`` / ``--config``, through the owner's own store. This module (an
operator tool, never imported by the ingress) is on the documented allow-list of gateway
modules that may import ``actors`` (``tests/unit/gateway/ingress/test_ingress_imports.py``).
Results have the shapes the owner answers with.
"""

from __future__ import annotations

import time
from typing import Any

from actors.stores.api_keys import API_KEYS, ApiKeyStore
from actors.stores.db import open_db
from actors.stores.limits import LIMITS, save_limit
from actors.stores.provider_keys import LazyDb
from schemas.limits import spec_arg


async def create(
    path: str, *, org: str, user: str, role: str, name: str, expires: float | None
) -> tuple[dict[str, Any], str]:
    """A new key in the file at ``path``: (its public row with ``key``, its hash).
    Raises ValueError (bad role or names), sqlite3.Error."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    now = time.time()
    try:
        key, rec = await store.create(
            org=org, user=user, role=role, name=name, expires=expires, now=now
        )
    finally:
        await store.db.aclose()
    return {**rec.public(now), "key": key}, rec.key_hash


async def listing(path: str) -> list[dict[str, Any]]:
    """Every key's public row (never a key or its hash). Raises sqlite3.Error."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rows = await store.records()
    finally:
        await store.db.aclose()
    now = time.time()
    return [r.public(now) for r in rows]


async def revoke(path: str, ref: str) -> tuple[dict[str, Any], str] | None:
    """Revoke key ``ref`` (an id or the key): (its public row, its hash); None if unknown.
    Raises sqlite3.Error."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rec = await store.revoke(ref, time.time())
    finally:
        await store.db.aclose()
    return (rec.public(time.time()), rec.key_hash) if rec is not None else None


async def store_limit(path: str, values: dict[str, Any]) -> None:
    """Store the limit ``values`` (``limits set``'s arguments, ``kind`` and ``id`` included)
    in the LimitsActor's table of the file at ``path``; the owner loads it when it starts.
    Raises InvalidRequestError (a bad limit), sqlite3.Error."""
    spec = spec_arg(values)
    db = await open_db(path, [LIMITS])
    try:
        await save_limit(db, f"{values['kind']}:{values['id']}", spec, time.time())
    finally:
        await db.close()
