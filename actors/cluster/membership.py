"""Which actor hosts are alive: one key per host in a key-value bucket with a TTL.

A host writes its key every heartbeat; a key no write refreshed for the bucket's TTL is gone,
and with it the host. Live hosts are the keys present now. Each beat's value says what the
host is (``HostBeat``: its role, since when this process is a member, when it beat, the
config version it runs), for operators (``cluster members``: a host that did not follow a
reload shows another version); placement reads only the keys.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from bus import KvConflictError

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import KeyValue

HOSTS_BUCKET = "llmgw_hosts"


class HostBeat(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a host's key: its ``role``, since when it is a member and when it beat
    (unix seconds, the host's wall clock)."""

    role: str
    since: float
    at: float
    config: str = ""  # the version of the config it runs ("": not said)


_decode_beat = msgspec.json.Decoder(HostBeat).decode


class NodeIdInUseError(Exception):
    """Another live process heartbeats under this host's node id."""


class MembershipLostError(Exception):
    """This host's key is gone while it still beat under it: it lapsed, or a peer removed
    it (it took this host for dead). The next beat joins afresh."""


class Membership:
    """This host's heartbeat in ``kv`` (the hosts bucket) and the view of who else is alive.

    Raises BusClosedError when the bucket cannot be reached.
    """

    def __init__(
        self,
        kv: KeyValue,
        node_id: str,
        *,
        role: str = "actors",
        wall: Callable[[], float] = time.time,
        config: Callable[[], str] | None = None,
    ) -> None:
        """``config``: the version of the config this host runs, as of each beat."""
        self.node_id = node_id
        self._config = config
        self._kv = kv
        self._role = role
        self._wall = wall
        self._since = wall()
        self._revision: int | None = None  # of our last beat

    async def beat(self) -> None:
        """Refresh this host's key by compare-and-set on our last beat's revision, or
        announce it when we have none or it lapsed.

        Raises NodeIdInUseError when the key is held by another writer: a second process
        under the same id (or, at the first beat, our previous incarnation, not lapsed yet);
        MembershipLostError when our key is gone (nothing written: the host must stop what
        it ran under it before it joins again).
        """
        config = self._config() if self._config is not None else ""
        beat = HostBeat(role=self._role, since=self._since, at=self._wall(), config=config)
        value = msgspec.json.encode(beat)
        try:
            if self._revision is not None:
                try:
                    self._revision = await self._kv.update(
                        self.node_id, value, revision=self._revision
                    )
                    return
                except KvConflictError:
                    if await self._kv.get(self.node_id) is not None:
                        raise
                    self._revision = None
                    raise MembershipLostError(
                        f"the membership of {self.node_id!r} is gone"
                    ) from None
            self._revision = await self._kv.create(self.node_id, value)
        except KvConflictError:
            self._revision = None
            raise NodeIdInUseError(f"node id {self.node_id!r} is in use") from None

    async def live(self) -> list[str]:
        """The ids of the hosts whose key has not lapsed, sorted."""
        return sorted(await self._kv.keys())

    async def revisions(self) -> dict[str, int]:
        """Each live host's id and the revision of its last beat (a host whose key lapsed
        since the listing is left out)."""
        found: dict[str, int] = {}
        for node in await self.live():
            entry = await self._kv.get(node)
            if entry is not None:
                found[node] = entry.revision
        return found

    async def remove(self, node: str, revision: int) -> bool:
        """Remove host ``node``'s key while its last beat is still ``revision`` (a host taken
        for dead); False when it beat since (it lives) or is gone already."""
        try:
            await self._kv.delete(node, revision=revision)
        except KvConflictError:
            return False
        return True

    async def members(self) -> dict[str, HostBeat | None]:
        """Each live host's last beat (None for a value this version cannot read)."""
        found: dict[str, HostBeat | None] = {}
        for node in await self.live():
            entry = await self._kv.get(node)
            if entry is None:
                continue  # lapsed since the listing
            try:
                found[node] = _decode_beat(entry.value)
            except msgspec.DecodeError:
                found[node] = None
        return found

    async def leave(self) -> None:
        """Remove this host's key at once, so the others need not wait out its TTL (only if
        it is still ours)."""
        if self._revision is not None:
            try:
                await self._kv.delete(self.node_id, revision=self._revision)
            except KvConflictError:
                return
