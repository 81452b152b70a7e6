"""A moment without a model's owner, waited out: the route request asked again for a while.

A model's owner (its ModelActor) has no subscription on the bus for a moment when its
supervisor restarts it, or when, in cluster mode, its unit moves to another host (a host
taken over, a NATS node lost and the hosts' heartbeats interrupted). A route request sent
then gets "no responders" at once; answering the client 503 for a gap of milliseconds would
fail requests the next owner serves a moment later.

:class:`OwnerWait` (one per ingress, used by ``plan_walk.Targeting`` only after a "no
responders") asks again every :data:`RETRY_EVERY_S` for at most :data:`WAIT_S` (and never
past the decision timeout). An owner that does not come back within it is noted as gone:
the next requests for that model get the 503 at once, without waiting, until its owner
answers again, so an actors host that is down costs one wait, not one per request.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from schemas import NoRespondersError, RoutePlan

if TYPE_CHECKING:
    from bus import Bus
    from schemas import ErrorReply, RouteRequest

__all__ = ["RETRY_EVERY_S", "WAIT_S", "OwnerWait"]

WAIT_S = 1.0
"""How long a route request waits for a model's owner to come back."""
RETRY_EVERY_S = 0.025
"""How often it asks again meanwhile (the bus says at once when no one subscribes)."""


class OwnerWait:
    """Owns the set of route subjects whose owner did not come back within the wait."""

    def __init__(self, bus: Bus, wait: float = WAIT_S, every: float = RETRY_EVERY_S) -> None:
        self._bus = bus
        self._wait = wait
        self._every = every
        self.gone: set[str] = set()

    async def ask_again(
        self, subject: str, route_req: RouteRequest, timeout: float
    ) -> RoutePlan | ErrorReply:
        """The owner's reply once it subscribes again (``subject`` just had no responder).
        Raises NoRespondersError at once for an owner already noted gone, and after the wait
        for one that does not come back (noting it gone); what the bus raises otherwise."""
        if subject in self.gone:
            raise NoRespondersError("the model's owner did not come back")
        loop = asyncio.get_running_loop()
        until = loop.time() + min(self._wait, timeout)
        while True:
            await asyncio.sleep(self._every)  # polled: the bus has no event for a new subscriber
            try:
                return await self._bus.request(
                    subject, route_req, reply_type=RoutePlan, timeout=timeout
                )
            except NoRespondersError:
                if loop.time() >= until:
                    self.gone.add(subject)
                    raise

    def answered(self, subject: str) -> None:
        """``subject``'s owner answered: it is not gone (any more)."""
        self.gone.discard(subject)
