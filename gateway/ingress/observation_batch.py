"""Observations sent together: those an ingress makes of one endpoint in one turn of its event
loop go out over NATS as one ``ObservationBatch`` on that endpoint's subject.

Under ``llmgw serve --workers N`` at concurrency a worker settles several attempts of the same
endpoint in one turn, and each observation was a NATS message of its own (written, routed by
nats-server, read and decoded on the actors host). The receiving bus delivers a batch's
observations one by one (bus/nats_subscribing.py), so no subscriber sees a batch. They leave
at the end of the turn they were made in. In process an observation is handed to its
subscribers' mailboxes: nothing to save, so none is held (see :func:`observation_batcher`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bus import InProcessBus
from gateway.http.deadline import Resumed
from schemas import GatewayError, Observation, ObservationBatch

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from bus import Bus

__all__ = ["BATCH_MAX", "ObservationBatcher", "observation_batcher"]

logger = logging.getLogger(__name__)

BATCH_MAX = 64
"""The most observations one batch carries (far below NATS's 1 MB message limit)."""


def observation_batcher(bus: Bus) -> ObservationBatcher | None:
    """This ingress's batcher of observations on ``bus``; None in process (none is held)."""
    return None if isinstance(bus, InProcessBus) else ObservationBatcher(bus)


class ObservationBatcher:
    """Owns the observations made in the current turn of the event loop, by subject, until
    they are sent, and the tasks sending them."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._pending: dict[str, list[Observation]] = {}
        self._flush_due = False
        self._sending: set[asyncio.Task[None]] = set()

    async def publish(self, subject: str, obs: Observation) -> None:
        """Send ``obs`` on ``subject`` with this turn's others (never waits, never raises: a
        batch the bus refuses is logged, as a lone observation was)."""
        pending = self._pending.get(subject)
        if pending is None:
            pending = self._pending[subject] = []
        pending.append(obs)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send the observations held now (the end of the turn, or a message that must not
        overtake them)."""
        self._flush_due = False
        pending, self._pending = self._pending, {}
        for subject, made in pending.items():
            for at in range(0, len(made), BATCH_MAX):
                part = made[at : at + BATCH_MAX]
                msg = part[0] if len(part) == 1 else ObservationBatch(observations=tuple(part))
                self._start(self._send(subject, msg))

    def _start(self, sending: Coroutine[Any, Any, None]) -> None:
        """Run ``sending`` now; a task finishes it only if it waits (a NATS publish waits only
        while the connection is down): a turn's batch costs no task."""
        try:
            waiting = sending.send(None)
        except StopIteration:
            return
        task = asyncio.ensure_future(_rest(sending, waiting))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, subject: str, msg: Observation | ObservationBatch) -> None:
        try:
            await self._bus.publish(subject, msg)
        except GatewayError as exc:
            logger.warning("event on %s not published: %s", subject, exc)


async def _rest(sending: Coroutine[Any, Any, None], waiting: Any) -> None:
    await Resumed(sending, waiting)
