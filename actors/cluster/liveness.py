"""Telling a dead actors host from one that lives but cannot reach JetStream, without ever
two owners of a unit.

A host killed (its process gone) has its NATS connection closed, which its server sees at
once: from then on a request to the subject only that process answers
(``subjects.cluster_alive``) gets "no responders" at once, through any server of the
cluster. A host that lives but whose beats do not reach JetStream (a bucket electing a
leader) still answers it. So every host answers its own subject and asks each peer's every
quarter heartbeat (``ClusterHost.ask_round``):

- a survivor that got "no responders" from a peer on every ask for ``dead_after`` seconds
  (``DEAD_AFTER_S`` by default: longer than a live host takes to reconnect to another
  server), the peer's key at one revision all along, takes it for dead (``Suspects``): it
  removes the peer's key by compare-and-set on that revision and takes its units over,
  without waiting out the key's TTL. An answer, a timeout (alive but slow, or the asker
  cut off) or a newer beat starts the count again.
- a host that was not dead (cut from its server longer than that, or on the far side of a
  split between servers) must not answer for its units once a survivor may have done so.
  It answers only within its serving lease (``ServingLease``, enforced by ``GatedBus``),
  renewed by each beat that landed and by each round of asks that every peer answered, sent
  while the lease held, and lasting ``dead_after - MARGIN_S`` from when that beat or round
  was sent. A survivor's count starts only once the host is unseen and at the revision of
  its last beat, so it ends after the lease; and the compare-and-set makes a beat that landed
  meanwhile win. Past its lease the host holds its units' messages until a beat lands under
  its own revision; when its key is gone instead, it stops its units and joins afresh.

Which peers must answer: those listed by a placement round that began after this host's
last beat landed. A survivor counts a peer only once it saw the peer's key change, so the
peer beat after the survivor joined, and the round after that beat lists the survivor. A
host with no peer so listed asks itself (its own connection works).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

from bus import NoRespondersError
from schemas import HostAlive, subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus, Subscription

logger = logging.getLogger(__name__)

# "No responders" this long, from every ask, is a dead host: more than a live host takes to
# reconnect to another server (nats-py tries the next one at once; 1 s between rounds).
DEAD_AFTER_S = 2.5
# What the serving lease keeps short of DEAD_AFTER_S: asks in flight, a busy event loop.
MARGIN_S = 0.5


def dead_after(heartbeat: float) -> float:
    """How long a peer must be silent to be taken for dead, for beats every ``heartbeat``
    seconds: ``DEAD_AFTER_S``, or more for slow beats (a host alone renews its serving
    lease by its beats only, which must outlast one beat missed)."""
    return max(DEAD_AFTER_S, 2 * heartbeat + MARGIN_S)


class ServingLease:
    """How long this host may answer for its units: until ``dead_after - MARGIN_S`` seconds
    after the last beat that landed or round of asks every peer answered was sent."""

    def __init__(self, clock: Callable[[], float], dead_after: float = DEAD_AFTER_S) -> None:
        self._clock = clock
        self._window = dead_after - MARGIN_S
        self._until = -math.inf
        self._renewed = asyncio.Event()

    def valid(self) -> bool:
        """True while this host may answer for its units."""
        return self._clock() < self._until

    def renew(self, sent: float) -> None:
        """A beat sent at ``sent`` landed under our revision."""
        self._extend_to(sent + self._window)

    def vouched(self, sent: float) -> bool:
        """Every peer answered a round of asks sent at ``sent``: the lease runs on, if it
        held then (past it, a survivor may have taken our units). True when renewed."""
        if sent >= self._until:
            return False
        self._extend_to(sent + self._window)
        return True

    def end(self) -> None:
        """This host answers for nothing until the next beat lands (its units stopped)."""
        self._until = -math.inf

    async def wait(self) -> None:
        """Return once the lease holds."""
        while not self.valid():
            self._renewed.clear()
            await self._renewed.wait()

    def _extend_to(self, until: float) -> None:
        if until > self._until:
            self._until = until
            self._renewed.set()


class Suspects:
    """The peers this host asks, and since when each answered "no responders" at which
    revision of its key. ``dead`` names those silent for ``dead_after`` seconds."""

    def __init__(self, dead_after: float = DEAD_AFTER_S) -> None:
        self._dead_after = dead_after
        self._revisions: dict[str, int] = {}  # peer -> its key's revision, last listed
        self._first: dict[str, int] = {}  # peer -> the revision it was first listed at
        self._silent: dict[str, tuple[int, float]] = {}  # peer -> (revision, since)

    @property
    def peers(self) -> list[str]:
        """The peers last listed."""
        return list(self._revisions)

    def listed(self, revisions: dict[str, int]) -> None:
        """The peers' key revisions as a placement round read them: a peer that beat since
        (or is gone) is no longer counted silent."""
        self._revisions = dict(revisions)
        self._first = {node: self._first.get(node, rev) for node, rev in revisions.items()}
        for node, (revision, _) in list(self._silent.items()):
            if self._revisions.get(node) != revision:
                del self._silent[node]

    def heard(self, node: str, *, silent: bool, now: float) -> None:
        """The outcome of an ask of ``node``: ``silent`` for "no responders". A peer never
        seen to beat (listed at one revision only) is not counted: the peer may not list
        this host yet, so nothing it asks vouches for it (see ``ClusterHost.ask_round``)."""
        revision = self._revisions.get(node)
        if not silent or revision is None or self._first.get(node) == revision:
            self._silent.pop(node, None)
        elif self._silent.get(node, (None, 0.0))[0] != revision:
            self._silent[node] = (revision, now)

    def dead(self, now: float) -> dict[str, int]:
        """The peers silent at one revision for ``dead_after`` seconds, with that revision."""
        return {
            node: revision
            for node, (revision, since) in self._silent.items()
            if now - since >= self._dead_after
        }


async def ask(bus: Bus, asker: str, node: str, timeout: float) -> bool | None:
    """Ask ``node`` whether it lives: True (it answered), False ("no responders": no process
    subscribes its subject anywhere in the cluster), None (no answer in time, or the bus
    failed: nothing to conclude)."""
    try:
        await bus.request(
            subjects.cluster_alive(node),
            HostAlive(node=asker),
            reply_type=HostAlive,
            timeout=timeout,
        )
    except NoRespondersError:
        return False
    except Exception:  # a timeout, our own connection down: says nothing about the peer
        return None
    return True


async def answer_alive(sub: Subscription, node: str) -> None:
    """Answer every ask on ``sub`` (``subjects.cluster_alive(node)``) until cancelled or the
    subscription ends."""
    async for env in sub:
        try:
            await env.respond(HostAlive(node=node))
        except Exception as exc:  # the bus closing: the loop ends with the subscription
            logger.debug("alive answer not sent: %r", exc)
