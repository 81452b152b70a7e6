"""GatedBus: the bus as this host's actors see it in a cluster, answering only within the
host's serving lease (``liveness.ServingLease``).

While the lease does not hold, a message delivered to one of the host's actors waits before
the actor takes it (it is handled once the lease holds again, or dropped with the actor when
its unit stops), and whatever the actors reply or publish is dropped: a host past its lease
may have had its units taken over, so it grants nothing and announces nothing. Everything
else (requests, streams, buckets) passes through.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from bus import Envelope

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from actors.cluster.liveness import ServingLease
    from bus import Bus, KeyValue, Subscription
    from bus.protocol import Sink
    from schemas import ErrorReply, Message

logger = logging.getLogger(__name__)

T = TypeVar("T")


class GatedBus:
    """``bus`` gated by ``lease`` (see the module docstring); raises what ``bus`` raises.
    ``aclose`` leaves ``bus`` open: the host owns it."""

    def __init__(self, bus: Bus, lease: ServingLease) -> None:
        self._bus = bus
        self._lease = lease
        self.dropped = 0  # replies and publishes withheld past the lease
        self.held = 0  # messages that waited for the lease

    @property
    def closed(self) -> bool:
        """See ``Bus.closed``."""
        return self._bus.closed

    @property
    def connected(self) -> bool:
        """See ``Bus.connected``."""
        return self._bus.connected

    @property
    def servers(self) -> int:
        """See ``Bus.servers``."""
        return self._bus.servers

    async def reconnected(self) -> None:
        """See ``Bus.reconnected``."""
        await self._bus.reconnected()

    async def disconnected(self) -> None:
        """See ``Bus.disconnected``."""
        await self._bus.disconnected()

    async def publish(self, subject: str, msg: Message) -> None:
        """Publish through ``bus`` while the lease holds; else drop."""
        if self._withheld(subject):
            return
        await self._bus.publish(subject, msg)

    async def request(
        self, subject: str, msg: Message, *, reply_type: type[T], timeout: float
    ) -> T | ErrorReply:
        """See ``Bus.request``."""
        return await self._bus.request(subject, msg, reply_type=reply_type, timeout=timeout)

    def subscribe(
        self, subject: str, *, queue: str | None = None
    ) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe through ``bus``; each message is let through once the lease holds."""
        return _gated(self, self._bus.subscribe(subject, queue=queue))

    def replay(
        self, subject: str, *, stream: str, since: float
    ) -> AbstractAsyncContextManager[Subscription]:
        """See ``Bus.replay``; gated as ``subscribe``."""
        return _gated(self, self._bus.replay(subject, stream=stream, since=since))

    async def ensure_stream(self, name: str, subjects: list[str], **kept: Any) -> None:
        """See ``Bus.ensure_stream`` (``kept``: its keyword arguments)."""
        await self._bus.ensure_stream(name, subjects, **kept)

    async def delete_stream(self, name: str) -> None:
        """See ``Bus.delete_stream``."""
        await self._bus.delete_stream(name)

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> KeyValue:
        """See ``Bus.key_value``."""
        return await self._bus.key_value(bucket, ttl=ttl, replicas=replicas, grow_only=grow_only)

    async def aclose(self) -> None:
        """Nothing: the host closes ``bus``."""

    async def _hold(self, subject: str) -> None:
        self.held += 1
        if self.held & (self.held - 1) == 0:  # 1, 2, 4, ...: visible but not a flood
            logger.warning(
                "past this host's serving lease: its actors hold their messages (%d so far, "
                "this one on %s) until a beat lands",
                self.held,
                subject,
            )
        await self._lease.wait()

    def _withheld(self, subject: str) -> bool:
        if self._lease.valid():
            return False
        self.dropped += 1
        logger.debug("withheld a message on %s: past the serving lease", subject)
        return True

    async def _respond(self, env: Envelope, msg: Message) -> None:
        if not self._withheld(env.subject):
            await env.respond(msg)


@contextlib.asynccontextmanager
async def _gated(
    bus: GatedBus, inner: AbstractAsyncContextManager[Subscription]
) -> AsyncIterator[Subscription]:
    async with inner as sub:
        yield _GatedSubscription(bus, sub)


class _GatedSubscription:
    def __init__(self, bus: GatedBus, inner: Subscription) -> None:
        self.subject = inner.subject
        self._bus = bus
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[Envelope]:
        gate = self._bus._lease
        respond = self._bus._respond
        async for env in self._inner:
            if not gate.valid():
                await self._bus._hold(env.subject)
            if env.reply is None:
                yield env
                continue
            original = env

            async def responder(_reply: str, msg: Message, original: Envelope = original) -> None:
                await respond(original, msg)

            yield Envelope(env.subject, env.message, env.reply, responder)

    async def feed(self, sink: Sink) -> None:
        """Put each message into ``sink`` once the lease lets it through, waiting for room
        (no message goes in straight from delivery: the gate comes first)."""
        async for env in self:
            await sink.put(env)
