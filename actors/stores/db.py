"""The SQLite database every persistent owner shares: one file, WAL, one schema list.

Each owner declares its tables as ``Migration``s and calls :func:`open_db` with them; tables
are created if missing, so owners stay independent. WAL lets the CLI (``llmgw keys ...``)
and the server use the same file at once. The file and its ``-wal`` and ``-shm`` companions
are private to the owner (0600) from the first open: the WAL holds provider keys' secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiosqlite

if TYPE_CHECKING:
    from collections.abc import Iterable

_WAL_ATTEMPTS = 100
_WAL_RETRY_SECONDS = 0.05
_COMPANIONS = ("", "-wal", "-shm")
_PRIVATE = 0o600


class SharedDatabaseError(Exception):
    """A statement on the database a cluster shares (PostgreSQL) failed; the message names
    the database, never its password."""


@dataclass(frozen=True, slots=True)
class Migration:
    """``statements`` create one owner's tables and indexes idempotently."""

    name: str
    statements: tuple[str, ...]


async def open_db(path: str | Path, migrations: Iterable[Migration] = ()) -> aiosqlite.Connection:
    """Open (creating) the database at ``path`` in WAL mode and apply ``migrations``.

    Raises aiosqlite.Error (sqlite3.Error) when the file cannot be opened.
    """
    if str(path) != ":memory:":
        await asyncio.to_thread(_prepare_private, Path(path))
        # Refused here, on this thread: an aiosqlite connection that fails to open leaves
        # its worker thread to answer the loop later, and on a loop closed by then (a CLI
        # exiting on the error) that thread printed a traceback after the one-line error.
        await asyncio.to_thread(_can_open, str(path))
    db = await aiosqlite.connect(str(path))
    try:
        # The busy timeout first: switching a new file to WAL takes a lock another process
        # (a second ``llmgw keys`` run, the server) may hold for a moment.
        await db.execute("PRAGMA busy_timeout=5000")
        await _switch_to_wal(db)
        await db.execute("PRAGMA synchronous=NORMAL")
        for m in migrations:
            for stmt in m.statements:
                await db.execute(stmt)
        await db.commit()
    except BaseException:
        await db.close()
        raise
    return db


async def _switch_to_wal(db: aiosqlite.Connection) -> None:
    """``journal_mode=WAL``, retried: on a file another process is creating at the same moment
    SQLite can answer "database is locked" without waiting on the busy timeout."""
    for attempt in range(_WAL_ATTEMPTS):
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _WAL_ATTEMPTS - 1:
                raise
            await asyncio.sleep(_WAL_RETRY_SECONDS)


def _can_open(path: str) -> None:
    """Open and close the database at ``path``. Raises sqlite3.Error when SQLite cannot."""
    sqlite3.connect(path).close()


def _prepare_private(path: Path) -> None:
    """Create the database's directory, and the file with its ``-wal`` and ``-shm`` 0600
    before SQLite does (it would honour the process umask); narrow an existing one that
    others may read. Raises OSError when the directory cannot be made; a file it cannot
    create or narrow is left to SQLite, which reports what it cannot open itself (and only
    the owner may narrow a file another user shares)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in _COMPANIONS:
        name = f"{path}{suffix}"
        try:
            # The mode given at creation, not a umask change (process-wide, so racy under
            # the other threads); a umask can only narrow it further.
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE))
        except FileExistsError:
            with contextlib.suppress(OSError):
                mode = os.stat(name).st_mode & 0o777
                if mode & 0o077:
                    os.chmod(name, mode & 0o700)
        except OSError:
            continue
