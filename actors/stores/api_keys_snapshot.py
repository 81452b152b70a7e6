"""Gateway API keys as a snapshot of their unit (JetStream, in a cluster).

With several actors hosts the owner of the keys may be taken over by another host at any
moment; a key kept in the SQLite file of the host that created it would be gone with that
host. Here every key's row (its hash and display prefix, never the key) is kept in memory
and saved as one snapshot, ``api_keys``, through the unit's ``SnapshotStore``
(``actors.cluster.FencedSnapshots``: written only under the owner's lease) before a change
is answered. One value holds every key: a lookup is then a dict read, and a few thousand
keys stay well under JetStream's message size.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec

from actors.stores.api_keys import KEY_PREFIX, ApiKeyRecord, ApiKeys, hash_key

if TYPE_CHECKING:
    from actors.stores.snapshots import SnapshotStore

SNAPSHOT = "api_keys"


class SnapshotApiKeyStore(ApiKeys):
    """The gateway API keys in a snapshot. Raises what the store raises
    (BusClosedError when JetStream cannot be reached: nothing changed then), ValueError for
    an unknown role or an empty org/user name."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store
        self._by_hash: dict[str, ApiKeyRecord] | None = None

    async def _records(self) -> dict[str, ApiKeyRecord]:
        if self._by_hash is None:
            saved = await self._store.load_as(SNAPSHOT, list[ApiKeyRecord]) or []
            self._by_hash = {r.key_hash: r for r in saved}
        return self._by_hash

    async def _save(self, records: dict[str, ApiKeyRecord], now: float) -> None:
        data = msgspec.json.encode(list(records.values()))
        await self._store.save(SNAPSHOT, data, now, durable=True)
        self._by_hash = records

    async def any_keys(self) -> bool:
        """Whether any key was ever created (revoked ones count: auth stays on)."""
        return bool(await self._records())

    async def lookup(self, key_hash: str) -> ApiKeyRecord | None:
        """The key whose hash is ``key_hash``."""
        return (await self._records()).get(key_hash)

    async def lookup_id(self, key_id: str) -> ApiKeyRecord | None:
        """The key whose id is ``key_id``."""
        return next((r for r in (await self._records()).values() if r.id == key_id), None)

    async def records(self) -> list[ApiKeyRecord]:
        """Every key, oldest first."""
        return sorted((await self._records()).values(), key=lambda r: (r.created, r.id))

    async def _add(self, record: ApiKeyRecord) -> ApiKeyRecord:
        await self._save({**await self._records(), record.key_hash: record}, record.created)
        return record

    async def revoke(self, ref: str, now: float) -> ApiKeyRecord | None:
        """Revoke the key whose id is ``ref`` (or which is ``ref`` itself); None if unknown.
        Revoking twice keeps the first revocation time."""
        records = await self._records()
        if ref.startswith(KEY_PREFIX):
            found = records.get(hash_key(ref))
        else:
            found = next((r for r in records.values() if r.id == ref), None)
        if found is None or found.revoked is not None:
            return found
        revoked = dataclasses.replace(found, revoked=now)
        await self._save({**records, found.key_hash: revoked}, now)
        return revoked

    async def aclose(self) -> None:
        """Nothing to close: the store belongs to the unit."""
