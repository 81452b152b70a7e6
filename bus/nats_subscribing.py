"""NatsBus's subscriptions: how a NATS message reaches a subscriber's queue.

Two costs of nats-py are avoided for the plain subscriptions an actors host and an ingress
hold (every message a request sends crosses them, several per request on an actors host):

- nats-py hands each message to a task per subscription through a queue (a queue round and
  a task wake-up per message); :class:`DirectClient` instead calls the subscription's
  function from its read loop (each function only decodes and queues, it never waits);
- NATS sends a copy per subscription, so each subscriber of a subject cost this process a
  parse and a decode; :class:`Shared` is one NATS subscription per subject, the message
  decoded once and given to every local subscriber (as the in-process bus does);
- a ``<prefix>.*`` subscription and one to ``<prefix>.<id>`` each got a copy of a message to
  ``<prefix>.<id>`` (the steering actor's ``llmgw.obs.*`` beside an endpoint's actors'
  ``llmgw.obs.<endpoint>``); for a *family* the bus was opened with, every plain subscription
  to the family's wildcard or to one of its subjects is served by one NATS subscription to
  the wildcard (:class:`Feed`), each message decoded once for the subscribers of its subject
  and of the wildcard, and not decoded when this process has none.

Replay subscriptions (a JetStream ordered consumer) and queue groups keep their own NATS
subscription; replay ones keep nats-py's delivery, which the consumer's flow control needs.

Sending, :meth:`DirectClient.publish_now` spares a publish nats-py's flush machinery (a future
put on a queue for its flusher task, that task's wake-up and its ``drain``, per loop
iteration that publishes): the command joins nats-py's own outgoing buffer (so its order with
every other command holds) and one callback at the end of the loop iteration writes that
buffer to the socket. Receiving, :class:`MsgParser` reads the plain ``MSG`` lines (all that a
host's subscriptions get but replies with a status) with one ``find`` and ``split`` each and
hands a direct subscription's message on without a coroutine per message; anything else goes
to nats-py's parser.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client
from nats.aio.transport import TcpTransport
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

from bus.codec import CodecError, decode
from bus.errors import BusClosedError
from bus.inprocess import BufferedSubscription
from bus.protocol import Envelope
from schemas import ObservationBatch

if TYPE_CHECKING:
    import datetime
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription as _NatsSubscription

    from bus.nats_bus import NatsBus
    from schemas import Message

logger = logging.getLogger(__name__)

# A replay's consumer sends a heartbeat when idle this often; two missed and nats-py makes a
# new one (a NATS restart costs a replay 2-3 s of waiting, not its events).
_REPLAY_HEARTBEAT_S = 1.0

# Past this many bytes not yet taken by the socket, writes go back to nats-py's flusher, which
# waits for the socket to drain (the flow control publish_now's plain write lacks).
_WRITE_BUFFER_HIGH = 1024 * 1024


class DirectClient(Client):
    """nats-py's client whose read loop hands a message for a subscription in :attr:`direct`
    straight to its function, instead of queueing it for the subscription's task. Such a
    subscription is opened without a callback (nats-py then starts no task for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.direct: dict[int, Callable[[str, str, bytes, dict[str, str] | None], None]] = {}
        self._write_due = False
        self._ps = MsgParser(self)

    def publish_now(self, subject: str, payload: bytes, reply: str = "") -> bool:
        """Queue a PUB of ``payload`` on ``subject`` (subject and reply already checked) for
        the write at the end of this loop iteration. False, queueing nothing, when the
        connection is not up or the payload is over the server's limit: the caller then uses
        ``publish``, which buffers while reconnecting and raises what nats-py raises."""
        if (
            self._status != Client.CONNECTED
            or len(payload) > self._max_payload
            or type(self._transport) is not TcpTransport
        ):
            return False
        cmd = b"".join((f"PUB {subject} {reply} {len(payload)}\r\n".encode(), payload, b"\r\n"))
        self._pending.append(cmd)
        self._pending_data_size += len(cmd)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(payload)
        if not self._write_due:
            self._write_due = True
            asyncio.get_running_loop().call_soon(self._write_pending)
        return True

    def _write_pending(self) -> None:
        self._write_due = False
        transport = self._transport
        if not self._pending_data_size or self._status != Client.CONNECTED:
            return  # written by nats-py's flusher meanwhile, or kept for after a reconnect
        assert isinstance(transport, TcpTransport) and transport._io_writer is not None
        writer = transport._io_writer
        if writer.transport.get_write_buffer_size() > _WRITE_BUFFER_HIGH:
            if self._flush_queue is not None and self._flush_queue.empty():
                self._flush_queue.put_nowait(asyncio.get_running_loop().create_future())
            return
        pending, self._pending, self._pending_data_size = self._pending, [], 0
        writer.writelines(pending)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handle = self.direct.get(sid)
        if handle is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        hdr = await self._process_headers(headers) if headers else None
        self.hand(handle, subject, reply, data, hdr)

    def hand(
        self,
        handle: Callable[[str, str, bytes, dict[str, str] | None], None],
        subject: bytes,
        reply: bytes,
        data: bytes,
        hdr: dict[str, str] | None,
    ) -> None:
        """Give a direct subscription's message to its function (counted in the stats)."""
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
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


class MsgParser(Parser):
    """nats-py's parser with a fast path for what a busy host reads most: plain ``MSG``
    lines, as nats-server writes them (single spaces), each read with one ``find`` and one
    ``split`` instead of a regex match and a ``del`` of the buffer's head per message, and
    given to a direct subscription without a coroutine. The rest of a read (other
    operations, headers, a split message) goes to nats-py's parse as before."""

    nc: DirectClient

    async def parse(self, data: bytes = b"") -> None:
        """Parse ``data`` after what an earlier read left; dispatch each whole message."""
        buf = self.buf
        buf.extend(data)
        if self.state != AWAITING_CONTROL_LINE:
            await super().parse()
            return
        nc = self.nc
        direct = nc.direct
        pos, size = 0, len(buf)
        try:
            while buf.startswith(b"MSG ", pos):
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                parts = bytes(buf[pos + 4 : end]).split(b" ")
                if len(parts) == 3:
                    subject, sid, length = parts
                    reply = b""
                elif len(parts) == 4:
                    subject, sid, reply, length = parts
                else:
                    break  # not as nats-server writes it: nats-py's parser judges
                if not (sid.isdigit() and length.isdigit()):
                    break
                start = end + 2
                stop = start + int(length)
                if stop + 2 > size:
                    break  # the payload is not all here yet
                payload = bytes(buf[start:stop])
                pos = stop + 2
                handle = direct.get(int(sid))
                if handle is not None:
                    nc.hand(handle, subject, reply, payload, None)
                else:
                    await nc._process_msg(int(sid), subject, reply, payload, b"")
        finally:
            del buf[:pos]
        if buf:
            await super().parse()


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
        family = bus._family_of(self._subject)
        try:
            if family is None:
                shared.nats_sub = await self._open(receiver(bus, shared))
                await bus._barrier()
            else:
                await self._use_feed(family)
        except (nats.errors.Error, BusClosedError) as exc:
            bus._shared.pop(self._subject, None)
            error = (
                exc
                if isinstance(exc, BusClosedError)
                else BusClosedError(f"cannot subscribe to {self._subject}: {exc!r}")
            )
            shared.ready.set_exception(error)
            shared.ready.exception()  # retrieved: no "never retrieved" warning without joiners
            if shared.nats_sub is not None:
                self._nats_sub = shared.nats_sub
                await self._unsubscribe()
            raise error from exc
        shared.ready.set_result(None)

    async def _use_feed(self, family: str) -> None:
        """Count one more subject of ``family`` on its :class:`Feed`, opening the feed first
        if there is none; returns once the server has the interest. Raises BusClosedError."""
        bus = self._bus
        while (feed := bus._feeds.get(family)) is not None:
            await asyncio.shield(feed.ready)  # raises BusClosedError when its opening failed
            if bus._feeds.get(family) is feed:  # not closed meanwhile by its last subject
                feed.subjects += 1
                return
        bus._check_open()
        feed = bus._feeds[family] = Feed()
        try:
            feed.nats_sub = await bus._nc.subscribe_direct(family, feed_receiver(bus, family))
            await bus._barrier()
        except nats.errors.Error as exc:
            bus._feeds.pop(family, None)
            error = BusClosedError(f"cannot subscribe to {family}: {exc!r}")
            feed.ready.set_exception(error)
            feed.ready.exception()
            if feed.nats_sub is not None:
                self._nats_sub = feed.nats_sub
                await self._unsubscribe()
            raise error from exc
        feed.ready.set_result(None)

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
                family = self._bus._family_of(self._subject)
                if family is not None and (feed := self._bus._feeds.get(family)) is not None:
                    feed.subjects -= 1
                    if feed.subjects == 0:  # the family's last subject here: close the feed
                        del self._bus._feeds[family]
                        self._nats_sub = feed.nats_sub
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

        # An ordered consumer: ephemeral, in order, re-created by nats-py on a gap and when
        # two heartbeats are missed (the server restarted, its consumer gone with it).
        return await nc.jetstream().subscribe(
            self._subject,
            stream=stream,
            cb=cb,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=_StartTime(opt_start_time=start),
            idle_heartbeat=_REPLAY_HEARTBEAT_S,
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


class _StartTime(ConsumerConfig):
    """A consumer from a time that nats-py can re-create from the next stream sequence.

    nats-py re-creates an ordered consumer by setting ``deliver_policy`` and
    ``opt_start_seq`` on this config; with ``opt_start_time`` still set the server refused
    it (both starts given), so a replay went silent for good after a NATS restart. The time
    gives way to the sequence here, unless nothing was delivered yet (sequence 1: the time
    still says where to start)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "opt_start_seq" and value is not None and self.opt_start_time is not None:
            if value == 1:
                super().__setattr__("deliver_policy", DeliverPolicy.BY_START_TIME)
                value = None
            else:
                super().__setattr__("opt_start_time", None)
        super().__setattr__(name, value)


class Shared:
    """One plain NATS subscription and the local subscribers of its subject."""

    __slots__ = ("nats_sub", "ready", "subs")

    def __init__(self, subs: tuple[BufferedSubscription, ...]) -> None:
        self.subs = subs
        self.nats_sub: _NatsSubscription | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Feed:
    """One NATS subscription to a family's wildcard, serving the plain subscriptions to it
    and to its subjects (``subjects``: how many of those subjects have subscribers here)."""

    __slots__ = ("nats_sub", "ready", "subjects")

    def __init__(self) -> None:
        self.subjects = 1
        self.nats_sub: _NatsSubscription | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def feed_receiver(
    bus: NatsBus, family: str
) -> Callable[[str, str, bytes, dict[str, str] | None], None]:
    """The function that decodes a message of ``family`` once and delivers it to the local
    subscribers of its subject and of the family's wildcard (none: not decoded)."""
    shared = bus._shared
    respond = bus._respond

    def on_msg(subject: str, reply: str, data: bytes, _headers: dict[str, str] | None) -> None:
        own = shared.get(subject)
        wild = shared.get(family)
        if own is None and wild is None:
            return
        for env in _envelopes(subject, reply, data, respond):
            for sub in (*(own.subs if own else ()), *(wild.subs if wild else ())):
                sub.deliver(env)

    return on_msg


def receiver(
    bus: NatsBus, to: Shared | tuple[BufferedSubscription, ...]
) -> Callable[[str, str, bytes, dict[str, str] | None], None]:
    """The function that decodes a message once and delivers it to ``to``'s subscribers (a
    shared subscription's, read at each message: they come and go)."""
    respond = bus._respond

    def on_msg(subject: str, reply: str, data: bytes, _headers: dict[str, str] | None) -> None:
        for env in _envelopes(subject, reply, data, respond):
            for sub in to.subs if isinstance(to, Shared) else to:
                sub.deliver(env)

    return on_msg


def _envelopes(
    subject: str, reply: str, data: bytes, respond: Callable[[str, Message], Awaitable[None]]
) -> tuple[Envelope, ...]:
    """The message ``data`` decoded, as delivered: an ObservationBatch (an ingress's
    observations of one turn, gateway/ingress/observation_batch.py) as each of its
    observations; none (logged) when it does not decode."""
    try:
        message = decode(data)
    except CodecError as exc:
        logger.error("dropped an undecodable message on %s: %s", subject, exc)
        return ()
    if type(message) is ObservationBatch:
        return tuple(Envelope(subject, obs, None, None) for obs in message.observations)
    return (Envelope(subject, message, reply or None, respond if reply else None),)
