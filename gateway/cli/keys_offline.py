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

import functools
import sqlite3
import time
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from actors.stores.api_keys import API_KEYS, ApiKeyStore
from actors.stores.db import open_db
from actors.stores.limits import LIMITS, save_limit
from actors.stores.provider_keys import LazyDb
from schemas.limits import spec_arg

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

P = ParamSpec("P")
T = TypeVar("T")


class UnusableDatabaseError(ValueError):
    """The file named is no database this command can use (not SQLite, unreadable)."""


def _on_the_file(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``fn``, its sqlite3.Error raised as UnusableDatabaseError (one line for the
    operator, not a traceback)."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except sqlite3.Error as exc:
            raise UnusableDatabaseError(f"cannot use the database file: {exc}") from None

    return run


@_on_the_file
async def create(
    path: str, *, org: str, user: str, role: str, name: str, expires: float | None
) -> tuple[dict[str, Any], str]:
    """A new key in the file at ``path``: (its public row with ``key``, its hash).
    Raises ValueError (bad role or names), UnusableDatabaseError."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    now = time.time()
    try:
        key, rec = await store.create(
            org=org, user=user, role=role, name=name, expires=expires, now=now
        )
    finally:
        await store.db.aclose()
    return {**rec.public(now), "key": key}, rec.key_hash


@_on_the_file
async def listing(path: str) -> list[dict[str, Any]]:
    """Every key's public row (never a key or its hash). Raises UnusableDatabaseError."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rows = await store.records()
    finally:
        await store.db.aclose()
    now = time.time()
    return [r.public(now) for r in rows]


@_on_the_file
async def revoke(path: str, ref: str) -> tuple[dict[str, Any], str] | None:
    """Revoke key ``ref`` (an id or the key): (its public row, its hash); None if unknown.
    Raises UnusableDatabaseError."""
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rec = await store.revoke(ref, time.time())
    finally:
        await store.db.aclose()
    return (rec.public(time.time()), rec.key_hash) if rec is not None else None


@_on_the_file
async def store_limit(path: str, values: dict[str, Any]) -> None:
    """Store the limit ``values`` (``limits set``'s arguments, ``kind`` and ``id`` included)
    in the LimitsActor's table of the file at ``path``; the owner loads it when it starts.
    Raises InvalidRequestError (a bad limit), UnusableDatabaseError."""
    spec = spec_arg(values)
    db = await open_db(path, [LIMITS])
    try:
        await save_limit(db, f"{values['kind']}:{values['id']}", spec, time.time())
    finally:
        await db.close()
