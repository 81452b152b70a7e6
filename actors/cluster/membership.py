"""Which actor hosts are alive: one key per host in a key-value bucket with a TTL.

A host writes its key every heartbeat; a key no write refreshed for the bucket's TTL is gone,
and with it the host. Live hosts are the keys present now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bus import KeyValue

HOSTS_BUCKET = "llmgw_hosts"


class Membership:
    """This host's heartbeat in ``kv`` (the hosts bucket) and the view of who else is alive.

    Raises BusClosedError when the bucket cannot be reached.
    """

    def __init__(self, kv: KeyValue, node_id: str) -> None:
        self.node_id = node_id
        self._kv = kv

    async def beat(self) -> None:
        """Refresh this host's key (announce it, the first time)."""
        await self._kv.put(self.node_id, b"")

    async def live(self) -> list[str]:
        """The ids of the hosts whose key has not lapsed, sorted."""
        return sorted(await self._kv.keys())

    async def leave(self) -> None:
        """Remove this host's key at once, so the others need not wait out its TTL."""
        await self._kv.delete(self.node_id)
