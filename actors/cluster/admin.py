"""ClusterAdminActor: the admin area ``cluster``, answered by any actors host of a cluster.

- ``cluster.members`` (read only): every live actors host (``node_id``, ``role``, ``since``
  and ``last_heartbeat`` in unix seconds, the ``config_version`` it runs as of that beat,
  the ``units`` it owns, in tree order) and the units no live host owns now (``unowned``: a
  takeover or a handback under way). A host that did not follow a reload (its file did not
  validate, another version, a unit that failed to start) shows its own version.

The answer is read from JetStream (the hosts and owners buckets), not from this host's
memory, so every host answers the same; each runs one of these actors in one queue group,
outside placement, and one of them answers each command.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea
from actors.base import Actor, ActorContext, Serve
from bus import BusClosedError
from schemas import BusTimeoutError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.cluster.membership import Membership
    from actors.cluster.placement import Owners
    from bus import Envelope
    from schemas import AdminCommand

logger = logging.getLogger(__name__)

_QUEUE = "cluster_admin"
_RETRY_AFTER_S = 1.0


class ClusterAdminActor(Actor):
    """Answers ``cluster.members`` from the buckets ``membership`` and ``owners`` read;
    ``units`` are the tree's top-level children in order. Raises nothing of its own: an
    unreachable JetStream is answered as BusTimeoutError."""

    def __init__(
        self, node_id: str, units: Sequence[str], membership: Membership, owners: Owners
    ) -> None:
        self.name = "cluster_admin"
        self._node_id = node_id
        self._units = tuple(units)
        self._membership = membership
        self._owners = owners
        self.admin = AdminArea("cluster", {"members": self._members}, args={"members": frozenset()})
        self.serves = (Serve(self.admin.serve.subject, queue=_QUEUE),)

    async def on_start(self, ctx: ActorContext) -> None:
        """Nothing to build: the state is in JetStream."""
        self.ctx = ctx

    async def handle(self, env: Envelope) -> None:
        """Admin commands of area ``cluster``."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)

    async def _members(self, cmd: AdminCommand) -> dict[str, Any]:
        try:
            beats = await self._membership.members()
            owners = await self._owners.all()
        except BusClosedError as exc:
            logger.warning("cluster members: JetStream did not answer: %s", exc.message)
            raise BusTimeoutError(
                "the cluster's membership could not be read (JetStream did not answer)",
                retry_after=_RETRY_AFTER_S,
            ) from None
        members = []
        for node, beat in sorted(beats.items()):
            members.append(
                {
                    "node_id": node,
                    "role": beat.role if beat is not None else None,
                    "since": beat.since if beat is not None else None,
                    "last_heartbeat": beat.at if beat is not None else None,
                    "config_version": beat.config or None if beat is not None else None,
                    "units": [u for u in self._units if owners.get(u) == node],
                }
            )
        return {
            "members": members,
            "unowned": [u for u in self._units if owners.get(u) not in beats],
            "answered_by": self._node_id,
        }
