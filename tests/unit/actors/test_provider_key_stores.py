"""The provider-key stores, one contract over both: the SQLite file (one host) and
PostgreSQL (a cluster's ``database.url``, where the host taking the ``keys`` unit over reads
what its predecessor wrote). Real databases: a temporary file, a test database."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors.stores.db import SharedDatabaseError
from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore
from actors.stores.provider_keys_move import move_provider_keys
from actors.stores.provider_keys_postgres import PostgresProviderKeyStore
from schemas.config import credential_id

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

Store = ProviderKeyStore | PostgresProviderKeyStore


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A new store on this test's database each call (a later owner of the same data)."""
    if request.param == "sqlite":
        path = str(tmp_path / "llmgw.sqlite3")
        return lambda: ProviderKeyStore(LazyDb(path, [PROVIDER_KEYS]))
    url = str(request.getfixturevalue("postgres_url"))
    return lambda: PostgresProviderKeyStore(url)


async def test_keys_and_reservations_written_by_one_store_are_read_by_the_next(
    open_store: Callable[[], Store],
) -> None:
    first, second = open_store(), open_store()
    try:
        assert await first.declarations() == ((), {})
        a = await first.add("sk-a", endpoint="m:a", base_url="", min_role="free", now=2.0)
        b = await first.add("sk-b", endpoint="", base_url="http://b/v1/", min_role="pro", now=1.0)
        await first.reserve(credential_id("sk-env"), "pro", 3.0)
        await first.reserve(credential_id("sk-lifted"), "pro", 3.0)
        await first.reserve(credential_id("sk-lifted"), "free", 4.0)
        await first.aclose()

        keys, reservations = await second.declarations()
        assert keys == (b, a)  # creation order
        assert b.base_url == "http://b/v1" and b.key_id.startswith("pk-")
        assert reservations == {credential_id("sk-env"): "pro"}
        assert await second.secret(a.credential_id) == "sk-a"
        assert await second.secret(credential_id("sk-unknown")) is None
        raised = await second.set_min_role(a.key_id, "internal")
        assert raised is not None and raised.min_role == "internal"
        assert await second.set_min_role("pk-none", "pro") is None
        assert await second.delete(b.key_id) is True
        assert await second.delete(b.key_id) is False
        assert (await second.declarations())[0] == (raised,)
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_unreachable_postgres_is_a_shared_database_error_without_the_password() -> None:
    store = PostgresProviderKeyStore("postgresql://llmgw:hunter2@127.0.0.1:1/llmgw")
    with pytest.raises(SharedDatabaseError) as raised:
        await store.declarations()
    assert "127.0.0.1:1" in str(raised.value) and "hunter2" not in str(raised.value)
    await store.aclose()


async def test_a_hosts_file_moves_into_postgres_without_overriding_the_clusters_word(
    tmp_path: Path, postgres_url: str
) -> None:
    path = str(tmp_path / "llmgw.sqlite3")
    local = ProviderKeyStore(LazyDb(path, [PROVIDER_KEYS]))
    shared = PostgresProviderKeyStore(postgres_url)
    try:
        a = await local.add("sk-a", endpoint="m:a", base_url="", min_role="free", now=1.0)
        b = await local.add("sk-b", endpoint="", base_url="http://b/v1", min_role="pro", now=2.0)
        await local.reserve(credential_id("sk-env"), "pro", 1.0)
        await local.reserve(credential_id("sk-both"), "internal", 1.0)
        await shared.reserve(credential_id("sk-both"), "pro", 5.0)  # the cluster's newer word
        rows = await local.rows()

        moved = await move_provider_keys(path, postgres_url)

        assert moved.key_ids == (a.key_id, b.key_id)
        assert set(moved.reservations) == {credential_id("sk-env"), credential_id("sk-both")}
        keys, reservations = await shared.declarations()
        assert keys == (a, b)
        assert await shared.secret(a.credential_id) == "sk-a"
        assert reservations == {credential_id("sk-env"): "pro", credential_id("sk-both"): "pro"}
        assert await local.declarations() == ((), {})  # gone from the file: cannot come back
        assert not await move_provider_keys(path, postgres_url)  # nothing left to move
        await shared.adopt(*rows)  # a move cut short and run again changes nothing
        assert await shared.declarations() == (keys, reservations)
    finally:
        await local.aclose()
        await shared.aclose()


async def test_a_host_without_a_file_moves_nothing_and_creates_none(
    tmp_path: Path, postgres_url: str
) -> None:
    path = tmp_path / "never.sqlite3"
    assert not await move_provider_keys(str(path), postgres_url)
    assert not path.exists()
