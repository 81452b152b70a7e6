"""Which actor hosts are alive: one key per host in a key-value bucket with a TTL.

A host writes its key every heartbeat; a key no write refreshed for the bucket's TTL is gone,
and with it the host. Live hosts are the keys present now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import KvConflictError

if TYPE_CHECKING:
    from bus import KeyValue

HOSTS_BUCKET = "llmgw_hosts"


class NodeIdInUseError(Exception):
    """Another live process heartbeats under this host's node id."""


class Membership:
    """This host's heartbeat in ``kv`` (the hosts bucket) and the view of who else is alive.

    Raises BusClosedError when the bucket cannot be reached.
    """

    def __init__(self, kv: KeyValue, node_id: str) -> None:
        self.node_id = node_id
        self._kv = kv
        self._revision: int | None = None  # of our last beat

    async def beat(self) -> None:
        """Refresh this host's key by compare-and-set on our last beat's revision, or
        announce it when we have none or it lapsed.

        Raises NodeIdInUseError when the key is held by another writer: a second process
        under the same id (or, at the first beat, our previous incarnation, not lapsed yet).
        """
        try:
            if self._revision is not None:
                try:
                    self._revision = await self._kv.update(
                        self.node_id, b"", revision=self._revision
                    )
                    return
                except KvConflictError:
                    if await self._kv.get(self.node_id) is not None:
                        raise
            self._revision = await self._kv.create(self.node_id, b"")
        except KvConflictError:
            self._revision = None
            raise NodeIdInUseError(f"node id {self.node_id!r} is in use") from None

    async def live(self) -> list[str]:
        """The ids of the hosts whose key has not lapsed, sorted."""
        return sorted(await self._kv.keys())

    async def leave(self) -> None:
        """Remove this host's key at once, so the others need not wait out its TTL (only if
        it is still ours)."""
        if self._revision is not None:
            try:
                await self._kv.delete(self.node_id, revision=self._revision)
            except KvConflictError:
                return
