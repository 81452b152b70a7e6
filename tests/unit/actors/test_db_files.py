"""The shared SQLite file and its ``-wal`` and ``-shm`` are private (0600) from the first
open, whatever the umask: the WAL holds a provider key's secret before any checkpoint."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import pytest

from actors.stores.db import Migration, open_db
from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SECRET = "sk-provider-secret-in-the-wal"
_NOTE = Migration("note", ("CREATE TABLE IF NOT EXISTS note (v TEXT)",))


@pytest.fixture
def default_umask() -> Iterator[None]:
    """The usual umask (0022), under which SQLite alone creates files 0644."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _widen(path: Path) -> None:
    """The three files as an older version left them: readable by everyone."""
    for suffix in ("", "-wal", "-shm"):
        os.close(os.open(f"{path}{suffix}", os.O_WRONLY | os.O_CREAT, 0o644))
        os.chmod(f"{path}{suffix}", 0o644)


def _modes(path: Path) -> dict[str, int]:
    return {s: stat.S_IMODE(os.stat(f"{path}{s}").st_mode) for s in ("", "-wal", "-shm")}


async def test_a_new_database_and_its_wal_and_shm_are_0600_from_the_first_open(
    tmp_path: Path, default_umask: None
) -> None:
    path = tmp_path / "data" / "llmgw.sqlite3"
    store = ProviderKeyStore(LazyDb(str(path), [PROVIDER_KEYS]))
    try:
        await store.add(SECRET, endpoint="m:a", base_url="http://a", min_role="free", now=1.0)

        assert SECRET.encode() in (tmp_path / "data" / "llmgw.sqlite3-wal").read_bytes()
        assert _modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        await store.db.aclose()


async def test_an_existing_database_readable_by_others_is_narrowed_to_0600_on_open(
    tmp_path: Path, default_umask: None
) -> None:
    path = tmp_path / "llmgw.sqlite3"
    db = await open_db(path, [_NOTE])
    await db.close()
    _widen(path)

    db = await open_db(path, [_NOTE])
    try:
        await db.execute("INSERT INTO note VALUES ('x')")
        await db.commit()

        assert _modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        await db.close()
