"""NatsBus's subscriptions: how a NATS message reaches a subscriber's queue.

Two costs of nats-py are avoided for the plain subscriptions an actors host and an ingress
hold (every message a request sends crosses them, several per request on an actors host):

- nats-py hands each message to a task per subscription through a queue (a queue round and
  a task wake-up per message); :class:`DirectClient` instead calls the subscription's
  function from its read loop (each function only decodes and queues, it never waits);
- NATS sends a copy per subscription, so each subscriber of a subject cost this process a
  parse and a decode; :class:`Shared` is one NATS subscription per subject, the message
  decoded once and given to every local subscriber (as the in-process bus does).

Replay subscriptions (a JetStream ordered consumer) and queue groups keep their own NATS
subscription; replay ones keep nats-py's delivery, which the consumer's flow control needs.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus.codec import CodecError, decode
from bus.errors import BusClosedError
from bus.inprocess import BufferedSubscription
from bus.protocol import Envelope

if TYPE_CHECKING:
    import datetime
    from collections.abc import Callable
    from types import TracebackType

    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription as _NatsSubscription

    from bus.nats_bus import NatsBus

logger = logging.getLogger(__name__)


class DirectClient(Client):
    """nats-py's client whose read loop hands a message for a subscription in :attr:`direct`
    straight to its function, instead of queueing it for the subscription's task. Such a
    subscription is opened without a callback (nats-py then starts no task for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.direct: dict[int, Callable[[str, str, bytes, dict[str, str] | None], None]] = {}

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handle = self.direct.get(sid)
        if handle is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        hdr = await self._process_headers(headers) if headers else None
        try:
            handle(subject.decode(), reply.decode(), data, hdr)
        except Exception:  # the read loop must go on: one bad message is logged, not fatal
            logger.exception("a message on %s was not delivered", subject.decode())

    async def subscribe_direct(
        self,
        subject: str,
        handle: Callable[[str, str, bytes, dict[str, str] | None], None],
        queue: str = "",
    ) -> _NatsSubscription:
        """Subscribe with ``handle`` called for each message. Raises what nats-py raises."""
        sub = await self.subscribe(subject, queue=queue)
        # nats-py's subscribe never yields to the loop after sending SUB, so no message of
        # this subscription can be read before it is registered here.
        self.direct[sub._id] = handle
        return sub

    def forget(self, sub: _NatsSubscription) -> None:
        """Stop handing ``sub``'s messages to its function (before unsubscribing)."""
        self.direct.pop(sub._id, None)


class NatsSubscribing(AbstractAsyncContextManager[BufferedSubscription]):
    """One subscription of a NatsBus, for an ``async with``: plain ones join their subject's
    :class:`Shared`, queue-group and replay ones have their own NATS subscription."""

    def __init__(
        self,
        bus: NatsBus,
        subject: str,
        queue: str | None,
        *,
        replay: tuple[str, datetime.datetime] | None = None,
    ) -> None:
        self._bus = bus
        self._subject = subject
        self._queue = queue
        self._replay = replay
        self._sub: BufferedSubscription | None = None
        self._nats_sub: _NatsSubscription | None = None

    async def __aenter__(self) -> BufferedSubscription:
        bus = self._bus
        bus._check_open()
        sub = BufferedSubscription(self._subject, self._queue, pending_limit=bus._pending_limit)
        if self._queue is None and self._replay is None:
            await self._join(sub)
        else:
            await self._open_own(sub)
        bus._subs.add(sub)
        self._sub = sub
        return sub

    async def _open_own(self, sub: BufferedSubscription) -> None:
        try:
            self._nats_sub = await self._open(receiver(self._bus, (sub,)))
            await self._bus._barrier()
        except nats.errors.Error as exc:
            await self._unsubscribe()
            raise BusClosedError(f"cannot subscribe to {self._subject}: {exc!r}") from exc

    async def _join(self, sub: BufferedSubscription) -> None:
        """Add ``sub`` to the subject's shared NATS subscription, opening that first if
        there is none; returns once the server has the interest."""
        bus = self._bus
        while (shared := bus._shared.get(self._subject)) is not None:
            await asyncio.shield(shared.ready)  # raises BusClosedError when its opening failed
            if bus._shared.get(self._subject) is shared:  # not closed meanwhile by its last
                shared.subs = (*shared.subs, sub)
                return
        bus._check_open()
        shared = bus._shared[self._subject] = Shared((sub,))
        try:
            shared.nats_sub = await self._open(receiver(bus, shared))
            await bus._barrier()
        except nats.errors.Error as exc:
            bus._shared.pop(self._subject, None)
            error = BusClosedError(f"cannot subscribe to {self._subject}: {exc!r}")
            shared.ready.set_exception(error)
            shared.ready.exception()  # retrieved: no "never retrieved" warning without joiners
            if shared.nats_sub is not None:
                self._nats_sub = shared.nats_sub
                await self._unsubscribe()
            raise error from exc
        shared.ready.set_result(None)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.close()
            self._bus._subs.discard(sub)
            shared = self._bus._shared.get(self._subject)
            if shared is not None and sub in shared.subs:
                shared.subs = tuple(s for s in shared.subs if s is not sub)
                if shared.subs:
                    return  # others still listen on the shared NATS subscription
                del self._bus._shared[self._subject]
                self._nats_sub = shared.nats_sub
        await self._unsubscribe()

    async def _open(
        self, handle: Callable[[str, str, bytes, dict[str, str] | None], None]
    ) -> _NatsSubscription:
        nc = self._bus._nc
        if self._replay is None:
            return await nc.subscribe_direct(self._subject, handle, queue=self._queue or "")
        stream, start = self._replay

        async def cb(msg: Msg) -> None:
            handle(msg.subject, msg.reply, msg.data, msg.headers)

        # An ordered consumer: ephemeral, in order, re-created by nats-py on a gap.
        return await nc.jetstream().subscribe(
            self._subject,
            stream=stream,
            cb=cb,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=start),
        )

    async def _unsubscribe(self) -> None:
        nats_sub, self._nats_sub = self._nats_sub, None
        if nats_sub is None:
            return
        self._bus._nc.forget(nats_sub)
        if self._bus._nc.is_closed:
            return
        try:
            await nats_sub.unsubscribe()
        except nats.errors.Error as exc:
            logger.debug("unsubscribe from %s failed: %r", self._subject, exc)


class Shared:
    """One plain NATS subscription and the local subscribers of its subject."""

    __slots__ = ("nats_sub", "ready", "subs")

    def __init__(self, subs: tuple[BufferedSubscription, ...]) -> None:
        self.subs = subs
        self.nats_sub: _NatsSubscription | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def receiver(
    bus: NatsBus, to: Shared | tuple[BufferedSubscription, ...]
) -> Callable[[str, str, bytes, dict[str, str] | None], None]:
    """The function that decodes a message once and delivers it to ``to``'s subscribers (a
    shared subscription's, read at each message: they come and go)."""
    respond = bus._respond

    def on_msg(subject: str, reply: str, data: bytes, _headers: dict[str, str] | None) -> None:
        try:
            message = decode(data)
        except CodecError as exc:
            logger.error("dropped an undecodable message on %s: %s", subject, exc)
            return
        env = Envelope(subject, message, reply or None, respond if reply else None)
        for sub in to.subs if isinstance(to, Shared) else to:
            sub.deliver(env)

    return on_msg
