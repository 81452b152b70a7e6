"""InProcessBus: the embedded default bus, with NATS subject semantics and no server.

Also owns what both buses share: :class:`BufferedSubscription`, the per-subscription queue
with NATS's slow-consumer limit; and the actor's :class:`Mailbox` it feeds. The subject rules
are ``bus.subscribing``'s.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

from bus.codec import (
    MESSAGE_TYPES,
    WIRE_ERRORS,
    decode,
    decode_message,
    encode,
    encode_message,
    not_a_message,
    reply_decoder,
    reply_error,
    wire_error,
)
from bus.errors import BusClosedError, NoRespondersError, RequestTimeoutError
from bus.history import KeptStream
from bus.kv import KeyValue, MemoryKeyValue
from bus.protocol import Envelope, Sink
from bus.subscribing import (
    Subscribing,
    SubscriptionConsumer,
    check_pattern,
    check_queue,
    check_subject,
    tokens_match,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractAsyncContextManager

    from schemas import ErrorReply, Message

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PENDING_LIMIT = 65536
STREAM_MAX_MSGS = 10_000  # in process, a stream keeps at most this many (memory, not disk)
STREAM_MAX_MSGS_PER_SUBJECT = 1_000  # and at most this many of one subject, when it bounds one
_ROUTE_CACHE_MAX = 8192


class BufferedSubscription(SubscriptionConsumer):
    """One subscription's queue of Envelopes, iterated by a single consumer.

    Delivery never blocks the publisher: past ``pending_limit`` queued messages, new ones are
    dropped and counted in ``dropped`` (NATS's slow-consumer rule). After ``close()`` the
    iterator ends and what was still queued is discarded, as NATS does on unsubscribe.
    Iterating from two tasks at once raises RuntimeError. :meth:`feed` moves the messages into
    a consumer's queue instead, most of them straight from ``deliver``.
    """

    __slots__ = ()  # the consumer's half declares them

    def __init__(
        self, subject: str, queue: str | None, *, pending_limit: int = DEFAULT_PENDING_LIMIT
    ) -> None:
        self.subject = subject
        self.queue = queue
        self.pending_limit = pending_limit
        self.dropped = 0
        self._tokens = tuple(subject.split("."))
        self._items: deque[Envelope] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Messages delivered but not yet taken by the consumer."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True once unsubscribed or the bus closed."""
        return self._closed

    def deliver(self, env: Envelope) -> None:
        """Queue ``env`` for the consumer, or drop and count it when the queue is full."""
        if self._closed:
            return
        sink = self._sink
        if sink is not None and not self._items:  # nothing older waits: straight in
            try:
                sink.put_nowait(env)
                return
            except asyncio.QueueFull:
                pass
        if len(self._items) >= self.pending_limit:
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, ...: visible but not a flood
                logger.warning(
                    "slow consumer on %r (queue %r): %d messages dropped so far",
                    self.subject,
                    self.queue,
                    self.dropped,
                )
            return
        self._items.append(env)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Route:
    """Who gets a message on one literal subject: every plain subscriber, one per group."""

    __slots__ = ("groups", "plain", "tick")

    def __init__(
        self,
        plain: tuple[BufferedSubscription, ...],
        groups: tuple[tuple[BufferedSubscription, ...], ...],
    ) -> None:
        self.plain = plain
        self.groups = groups
        self.tick = 0

    def deliver(self, env: Envelope) -> None:
        for sub in self.plain:
            sub.deliver(env)
        if self.groups:
            self.tick += 1
            for members in self.groups:
                members[self.tick % len(members)].deliver(env)


_NO_ROUTE = _Route((), ())


class Mailbox(Generic[T]):
    """A bounded FIFO with one consumer task (an actor's loop) and any number of producers:
    the part of ``asyncio.Queue`` an actor uses (``put_nowait``, ``put``, ``get``, ``empty``)
    at about half its cost per message (no getter list, no task accounting), and ``take``,
    ``get`` without its coroutine for a consumer that saw an item waiting. Owns its items
    and its waiters. ``put_nowait`` raises asyncio.QueueFull when ``maxsize`` items wait;
    ``put`` waits for room; ``get`` from two tasks at once raises RuntimeError; ``take`` on
    an empty mailbox raises IndexError."""

    __slots__ = ("_items", "_maxsize", "_putters", "_waiter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._waiter: asyncio.Future[None] | None = None  # the consumer's, while it waits
        self._putters: deque[asyncio.Future[None]] = deque()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        if len(self._items) >= self._maxsize:
            raise asyncio.QueueFull
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def put(self, item: T) -> None:
        while len(self._items) >= self._maxsize:
            putter = asyncio.get_running_loop().create_future()
            self._putters.append(putter)
            woken = False
            try:
                await putter
                woken = True
            finally:
                if not woken:
                    putter.cancel()
                    if putter in self._putters:
                        self._putters.remove(putter)
                    elif not putter.cancelled() and len(self._items) < self._maxsize:
                        self._wake_putter()  # woken, then cancelled: the room goes on
        self.put_nowait(item)

    async def get(self) -> T:
        items = self._items
        while not items:
            if self._waiter is not None:
                raise RuntimeError("a mailbox has one consumer")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take()

    def take(self) -> T:
        """The oldest item, without waiting (what ``get`` does once one is there): for a
        consumer that saw ``empty()`` return False. Raises IndexError when empty."""
        item = self._items.popleft()
        if self._putters:
            self._wake_putter()
        return item

    def _wake_putter(self) -> None:
        while self._putters:
            putter = self._putters.popleft()
            if not putter.done():
                putter.set_result(None)
                return


class InProcessBus:
    """The ``Bus`` for one process: NATS subject semantics, queue groups and request/reply.

    Streams (:meth:`ensure_stream`) are bounded in-memory histories, gone with the process:
    the capability JetStream gives NATS, so code replaying events needs no bus of its own.
    Every message is encoded by ``bus.codec`` (CodecError on a bad struct) and decoded when
    someone receives it. Queue groups take turns per subject. Raises ``NoRespondersError``
    when a request matches no subscriber, ``RequestTimeoutError`` when its reply is late,
    ``BusClosedError`` after ``aclose`` (pending requests fail with it too), ValueError on
    a malformed subject."""

    def __init__(
        self,
        *,
        pending_limit: int = DEFAULT_PENDING_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pending_limit = pending_limit
        self._clock = clock  # key-value TTLs only
        self._buckets: dict[str, MemoryKeyValue] = {}
        self._subs: list[BufferedSubscription] = []
        # Literal subject -> its subscribers; rebuilt lazily after any (un)subscribe.
        self._routes: dict[str, _Route] = {}
        self._replies: dict[str, asyncio.Future[bytes]] = {}
        self._inbox_ids = itertools.count(1)
        self._streams: dict[str, KeptStream] = {}
        # Literal subject -> the streams keeping it; rebuilt lazily after a stream changes.
        self._kept: dict[str, tuple[KeptStream, ...]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """True after ``aclose``."""
        return self._closed

    @property
    def connected(self) -> bool:
        """Until ``aclose``: there is no connection to lose."""
        return not self._closed

    @property
    def servers(self) -> int:
        """1: the bus is this process."""
        return 1

    async def reconnected(self) -> None:
        """Never returns: the bus is this process, there is no connection to lose."""
        await asyncio.Event().wait()

    disconnected = reconnected  # nor does this: a loss never comes

    async def publish(self, subject: str, msg: Message) -> None:
        """Deliver ``msg`` to every matching subscriber; never waits. Raises BusClosedError."""
        if self._closed:
            raise BusClosedError("bus is closed")
        route = self._routes.get(subject) or self._route(subject)
        # The codec's encode and decode inlined (their C methods, their checks and errors):
        # this runs for every event a request leaves.
        if type(msg) not in MESSAGE_TYPES:
            raise not_a_message(msg)
        try:
            data = encode_message(msg)
            # Decoded only for a receiver: most events have none here.
            message = decode_message(data) if route is not _NO_ROUTE else None
        except WIRE_ERRORS as exc:
            raise wire_error(msg, exc) from exc
        if self._streams:
            self._keep(subject, data)
        if message is not None:
            route.deliver(Envelope(subject, message, None, None))

    async def request(
        self, subject: str, msg: Message, *, reply_type: type[T], timeout: float
    ) -> T | ErrorReply:
        """Send ``msg`` to the subscribers of ``subject`` and return the first reply.

        Raises NoRespondersError, RequestTimeoutError, BusClosedError, CodecError.
        """
        if self._closed:
            raise BusClosedError("bus is closed")
        route = self._routes.get(subject) or self._route(subject)
        if type(msg) not in MESSAGE_TYPES:  # the codec inlined, as in publish
            raise not_a_message(msg)
        try:
            message = decode_message(encode_message(msg))
        except WIRE_ERRORS as exc:
            raise wire_error(msg, exc) from exc
        if route is _NO_ROUTE:
            raise NoRespondersError(f"no responders on {subject}")
        loop = asyncio.get_running_loop()
        inbox = f"_INBOX.{next(self._inbox_ids)}"
        reply: asyncio.Future[bytes] = loop.create_future()
        self._replies[inbox] = reply
        expiry = loop.call_later(timeout, _expire, reply, subject, timeout)
        try:
            route.deliver(Envelope(subject, message, inbox, self._respond))
            data = await reply
        finally:
            expiry.cancel()
            del self._replies[inbox]
        try:
            reply_message: T | ErrorReply = reply_decoder(reply_type).decode(data)
        except msgspec.DecodeError as exc:
            raise reply_error(reply_type, data, exc) from exc
        return reply_message

    def subscribe(
        self, subject: str, *, queue: str | None = None
    ) -> AbstractAsyncContextManager[BufferedSubscription]:
        """Subscribe for the duration of an ``async with``. Raises ValueError, BusClosedError."""
        check_pattern(subject)
        check_queue(queue)
        return Subscribing(functools.partial(self._add, subject, queue), self._remove)

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_age: float,
        max_msgs: int,
        max_msgs_per_subject: int | None = None,
        replicas: int = 1,
        memory: bool = False,
        grow_only: bool = False,
    ) -> None:
        """Keep what is published on ``subjects`` (patterns) in memory as stream ``name``,
        for ``max_age`` seconds and at most ``max_msgs`` messages (``max_msgs_per_subject``
        of one subject; see bus/history.py); an existing stream takes the new config and
        keeps its messages. The counts are capped at :data:`STREAM_MAX_MSGS` and
        :data:`STREAM_MAX_MSGS_PER_SUBJECT`; ``replicas`` has no meaning in one process,
        ``memory`` none here (always in memory). Raises ValueError, BusClosedError."""
        if self._closed:
            raise BusClosedError("bus is closed")
        for pattern in subjects:
            check_pattern(pattern)
        kept = self._streams.get(name)
        history = KeptStream(
            tuple(tuple(p.split(".")) for p in subjects),
            max_age,
            min(max_msgs, STREAM_MAX_MSGS),
            None
            if max_msgs_per_subject is None
            else min(max_msgs_per_subject, STREAM_MAX_MSGS_PER_SUBJECT),
        )
        if kept is not None:
            history.takes_over(kept, time.time())
        self._streams[name] = history
        self._kept.clear()

    async def delete_stream(self, name: str) -> None:
        """Drop the stream ``name`` and what it kept (a missing one is fine)."""
        self._streams.pop(name, None)
        self._kept.clear()

    def replay(
        self, subject: str, *, stream: str, since: float
    ) -> AbstractAsyncContextManager[BufferedSubscription]:
        """Subscribe to ``subject``: first what ``stream`` kept from ``since`` on, then live
        messages, in order and without a gap. Raises ValueError, BusClosedError (also on
        entry when the stream does not exist)."""
        check_pattern(subject)
        return Subscribing(
            functools.partial(self._add, subject, None, (stream, since)), self._remove
        )

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> KeyValue:
        """The in-memory bucket ``bucket`` (created on first use; ``ttl`` applies from then
        on; copies have no meaning in one process). Raises BusClosedError."""
        if self._closed:
            raise BusClosedError("bus is closed")
        found = self._buckets.get(bucket)
        if found is None:
            found = self._buckets[bucket] = MemoryKeyValue(
                bucket, ttl=ttl, clock=self._clock, closed=lambda: self._closed
            )
        found.ttl = ttl
        return found

    async def aclose(self) -> None:
        """End every subscription and fail pending requests with BusClosedError; idempotent."""
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            sub.close()
        self._subs.clear()
        self._routes.clear()
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(BusClosedError("bus closed while awaiting a reply"))

    async def _respond(self, inbox: str, msg: Message) -> None:
        if self._closed:
            raise BusClosedError("bus is closed")
        data = encode(msg)
        reply = self._replies.get(inbox)
        # A reply to a request that already timed out is dropped, as on NATS.
        if reply is not None and not reply.done():
            reply.set_result(data)

    def _route(self, subject: str) -> _Route:
        check_subject(subject)
        toks = subject.split(".")
        plain: list[BufferedSubscription] = []
        groups: dict[str, list[BufferedSubscription]] = {}
        for sub in self._subs:
            if tokens_match(sub._tokens, toks):
                if sub.queue is None:
                    plain.append(sub)
                else:
                    groups.setdefault(sub.queue, []).append(sub)
        members = tuple(tuple(m) for m in groups.values())
        route = _Route(tuple(plain), members) if plain or groups else _NO_ROUTE
        if len(self._routes) >= _ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[subject] = route
        return route

    def _keep(self, subject: str, data: bytes) -> None:
        streams = self._kept.get(subject)
        if streams is None:
            toks = subject.split(".")
            streams = tuple(
                h for h in self._streams.values() if any(tokens_match(p, toks) for p in h.patterns)
            )
            if len(self._kept) >= _ROUTE_CACHE_MAX:
                self._kept.clear()
            self._kept[subject] = streams
        if streams:
            now = time.time()
            for history in streams:  # see bus/history.py: appended here, trimmed there
                kept = history.by_subject.get(subject)
                if kept is None:
                    kept = history.by_subject[subject] = deque()
                kept.append((history.next, now, subject, data))
                history.next += 1
                if len(kept) > history.max_per_subject:
                    kept.popleft()  # the subject's own oldest: it never crowds the others out
                else:
                    history.count += 1
                    if history.count > history.max_msgs:
                        history.trim()

    def _add(
        self, subject: str, queue: str | None, replay: tuple[str, float] | None = None
    ) -> BufferedSubscription:
        if self._closed:
            raise BusClosedError("bus is closed")
        sub = BufferedSubscription(subject, queue, pending_limit=self._pending_limit)
        if replay is not None:
            stream, since = replay
            history = self._streams.get(stream)
            if history is None:
                raise BusClosedError(f"no stream {stream!r} on this bus")
            # Queued before the subscription joins the routes, with no await in between: the
            # kept messages come first, then live ones, none twice and none missed.
            for ts, kept_subject, data in tuple(history.entries(time.time())):
                if ts >= since and tokens_match(sub._tokens, kept_subject.split(".")):
                    sub.deliver(Envelope(kept_subject, decode(data), None, None))
        self._subs.append(sub)
        self._routes.clear()
        return sub

    def _remove(self, sub: BufferedSubscription) -> None:
        sub.close()
        if sub in self._subs:
            self._subs.remove(sub)
            self._routes.clear()


def _expire(reply: asyncio.Future[bytes], subject: str, timeout: float) -> None:
    if not reply.done():
        reply.set_exception(RequestTimeoutError(f"no reply on {subject} within {timeout:g}s"))
