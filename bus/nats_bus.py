"""NatsBus: the ``Bus`` over a NATS server (nats-py): the connection, publish, request,
subscribe, JetStream streams and replay. With ``nats_kv.py`` (its key-value buckets) and
``nats_subscribing.py`` (how a message reaches a subscriber) the only modules that import
``nats``.

Every nats-py failure is turned into a ``bus.errors`` type here; no nats type leaves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import logging
import secrets
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import NO_RESPONDERS_STATUS
from nats.js.api import (
    DiscardPolicy,
    Header,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)

from bus.codec import decode_reply, encode
from bus.errors import BusClosedError, NoRespondersError, RequestTimeoutError
from bus.inbox import INBOX_ROOT, inbox_prefix_for
from bus.inprocess import DEFAULT_PENDING_LIMIT, BufferedSubscription
from bus.nats_kv import NatsKeyValue
from bus.nats_subscribing import DirectClient, Feed, NatsSubscribing, Shared
from bus.subscribing import check_pattern, check_queue, check_subject

if TYPE_CHECKING:
    from schemas import ErrorReply, GatewayError, Message

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A long-running service rides out server restarts: retry forever, notice a dead peer within
# about ping_interval * (max_outstanding_pings + 1) seconds, buffer publishes meanwhile.
_RECONNECT_WAIT_S = 1
_PING_INTERVAL_S = 10
_MAX_OUTSTANDING_PINGS = 3
_ATTEMPT_TIMEOUT_S = 2
_OUTBOUND_BUFFER_BYTES = 8 * 1024 * 1024
_SUBSCRIBE_CONFIRM_S = 5
_CHECKED_MAX = 8192
# A key-value write that JetStream has not acknowledged by then fails: a host cut off from
# the cluster learns it within this, not at nats-py's default of 5 s.
_KV_TIMEOUT_S = 2.0
# Creating a replicated bucket or stream waits for its peers to elect a leader, which a
# starved machine (a host starting beside busy neighbours) can take well past 10 s to do; it
# happens once.
_CREATE_TIMEOUT_S = 30.0


def _is_inbox(subject: str) -> bool:
    return subject.split(".", 1)[0].startswith(INBOX_ROOT)


class NatsBus:
    """The ``Bus`` over one NATS connection; build it with :meth:`connect`.

    Raises ``NoRespondersError`` (the server reported no subscriber), ``RequestTimeoutError``,
    ``BusClosedError`` (closed, or the connection is unusable), ValueError on a malformed
    subject or an over-size message. Requests in flight when the bus closes end at their
    timeout with BusClosedError.
    """

    def __init__(
        self, *, pending_limit: int = DEFAULT_PENDING_LIMIT, families: tuple[str, ...] = ()
    ) -> None:
        self._nc = DirectClient()
        self._pending_limit = pending_limit
        self._subs: set[BufferedSubscription] = set()
        self._checked: set[str] = set()  # subjects already validated; bounded below
        # Plain subscriptions by subject: one NATS subscription each, however many local
        # subscribers share it (nats_subscribing.Shared).
        self._shared: dict[str, Shared] = {}
        # Families (``<prefix>.*``) whose plain subscriptions share one NATS subscription to
        # the wildcard (nats_subscribing.Feed), by their prefix with its dot.
        self._families = {_family_prefix(f): f for f in families}
        self._feeds: dict[str, Feed] = {}
        # Requests in flight by reply token; the replies arrive on one subscription,
        # ``<inbox prefix>.<random>.*``, opened in connect().
        self._replies: dict[str, asyncio.Future[bytes]] = {}
        self._reply_root = ""
        self._reply_ids = itertools.count()
        self._closed = False
        # Until the first connection, failed attempts are summed up by connect()'s one error.
        self._joined = False
        self._last_error: Exception | None = None
        self._back = asyncio.Event()  # set (and replaced) each time the connection is back
        self._gone = asyncio.Event()  # set (and replaced) each time it is lost or closed

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str | None = None,
        connect_timeout: float = 5.0,
        pending_limit: int = DEFAULT_PENDING_LIMIT,
        inbox_prefix: str | None = None,
        families: tuple[str, ...] = (),
    ) -> NatsBus:
        """Connect to ``url`` (comma-separated for a cluster); replies to this connection's
        requests arrive under :func:`inbox_prefix_for` ``(url, inbox_prefix)``.

        ``families``: event subjects ``<prefix>.*`` this process takes (nearly) all of, such
        as ``llmgw.obs.*`` on an actors host: every plain subscription to one or to one of its
        subjects is served by one NATS subscription to the wildcard, so a message reaches this
        process once however many of them match it. Not for request subjects: a request to
        any subject of a family here finds a responder (the wildcard), and times out.

        Raises BusClosedError when no server accepts within ``connect_timeout`` seconds,
        ValueError for an unusable inbox prefix.
        """
        prefix = inbox_prefix_for(url, inbox_prefix)
        bus = cls(pending_limit=pending_limit, families=families)
        servers = [s.strip() for s in url.split(",") if s.strip()]
        try:
            async with asyncio.timeout(connect_timeout):
                await bus._nc.connect(
                    servers,
                    name=name,
                    error_cb=bus._on_error,
                    disconnected_cb=bus._on_disconnected,
                    reconnected_cb=bus._on_reconnected,
                    closed_cb=bus._on_closed,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=_RECONNECT_WAIT_S,
                    ping_interval=_PING_INTERVAL_S,
                    max_outstanding_pings=_MAX_OUTSTANDING_PINGS,
                    connect_timeout=_ATTEMPT_TIMEOUT_S,
                    pending_size=_OUTBOUND_BUFFER_BYTES,
                    inbox_prefix=prefix,
                    # Subjects are checked here (check_subject, cached per subject) before
                    # nats-py sees them; its own regex per publish would check them again.
                    skip_subject_validation=True,
                )
                bus._reply_root = f"{prefix}.{secrets.token_hex(11)}."
                await bus._nc.subscribe_direct(bus._reply_root + "*", bus._on_reply)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            bus._closed = True
            await bus._close_client()
            why = bus._last_error if isinstance(exc, TimeoutError) and bus._last_error else exc
            raise BusClosedError(f"cannot connect to NATS at {url}: {_describe(why)}") from exc
        bus._joined = True
        return bus

    @property
    def closed(self) -> bool:
        """True after ``aclose`` or once the connection is closed for good."""
        return self._closed

    @property
    def connected(self) -> bool:
        """See ``Bus.connected``: False while nats-py reconnects (a request then waits in
        its buffer until its timeout)."""
        return not self._closed and self._nc.is_connected

    @property
    def servers(self) -> int:
        """The servers of the client's pool: those given, and those the cluster announced."""
        return max(1, len(self._nc.servers))

    async def publish(self, subject: str, msg: Message) -> None:
        """Send ``msg`` to every subscriber of ``subject``; buffered while reconnecting.

        Raises BusClosedError (also when the reconnect buffer is full), ValueError, CodecError.
        """
        self._check_open()
        self._check_subject(subject)
        data = encode(msg)
        if self._nc.publish_now(subject, data):
            return
        try:
            await self._nc.publish(subject, data)
        except nats.errors.Error as exc:
            raise self._mapped(exc, f"publish to {subject}") from exc

    async def request(
        self, subject: str, msg: Message, *, reply_type: type[T], timeout: float
    ) -> T | ErrorReply:
        """Send ``msg`` to one subscriber of ``subject`` and return its reply.

        Raises NoRespondersError, RequestTimeoutError, BusClosedError, ValueError, CodecError.
        """
        self._check_open()
        self._check_subject(subject)
        data = encode(msg)
        # Not nc.request: it draws a random token from os.urandom, builds it in a Python loop
        # and waits through asyncio.wait_for, per request. Here a counter names the reply and
        # one timer ends the wait (about a tenth of a worker's bus cost per request).
        token = str(next(self._reply_ids))
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[bytes] = loop.create_future()
        self._replies[token] = reply
        expiry = loop.call_later(timeout, _expire, reply)
        inbox = self._reply_root + token
        try:
            if not self._nc.publish_now(subject, data, inbox):
                await self._nc.publish(subject, data, reply=inbox)
            answer = await reply
        except nats.errors.Error as exc:
            raise self._mapped(exc, f"request on {subject} ({timeout:g}s)") from exc
        finally:
            expiry.cancel()
            del self._replies[token]
        return decode_reply(answer, reply_type)

    def _on_reply(
        self, subject: str, _reply: str, data: bytes, headers: dict[str, str] | None
    ) -> None:
        reply = self._replies.get(subject[len(self._reply_root) :])
        if reply is None or reply.done():
            return  # too late: the request timed out
        if headers and headers.get(Header.STATUS) == NO_RESPONDERS_STATUS:
            reply.set_exception(nats.errors.NoRespondersError())
        else:
            reply.set_result(data)

    def subscribe(
        self, subject: str, *, queue: str | None = None
    ) -> AbstractAsyncContextManager[BufferedSubscription]:
        """Subscribe for an ``async with``; entry returns once the server has the interest.

        Raises ValueError, BusClosedError.
        """
        check_pattern(subject)
        check_queue(queue)
        return NatsSubscribing(self, subject, queue)

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
        """Create (or update to this config) the JetStream stream ``name`` keeping what is
        published on ``subjects`` for ``max_age`` seconds, at most ``max_msgs`` messages
        (``max_msgs_per_subject`` of one subject), in ``replicas`` copies (``grow_only``: or
        the more it has), in the servers' memory with ``memory`` (else in their files).

        Raises BusClosedError when JetStream is unavailable or refuses the stream.
        """
        self._check_open()
        config = StreamConfig(
            name=name,
            subjects=subjects,
            max_age=max_age,
            max_msgs=max_msgs,
            max_msgs_per_subject=-1 if max_msgs_per_subject is None else max_msgs_per_subject,
            storage=StorageType.MEMORY if memory else StorageType.FILE,
            discard=DiscardPolicy.OLD,
            num_replicas=replicas,
        )
        js = self._nc.jetstream(timeout=_CREATE_TIMEOUT_S)
        try:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError:  # it exists with another config
                if grow_only:
                    had = (await js.stream_info(name)).config.num_replicas or 1
                    config.num_replicas = max(had, replicas)
                await js.update_stream(config)
        except nats.errors.Error as exc:
            raise BusClosedError(f"JetStream stream {name}: {exc!r}") from exc

    async def delete_stream(self, name: str) -> None:
        """Delete the JetStream stream ``name`` (a missing one is fine).

        Raises BusClosedError when JetStream is unavailable.
        """
        self._check_open()
        try:
            await self._nc.jetstream().delete_stream(name)
        except nats.js.errors.NotFoundError:
            return
        except nats.errors.Error as exc:
            raise BusClosedError(f"JetStream stream {name}: {exc!r}") from exc

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> NatsKeyValue:
        """The JetStream key-value bucket ``bucket`` (file storage, one revision kept per
        key), created or updated to ``ttl`` and ``replicas`` (``grow_only``: or the more it
        has: a count a host takes from the servers it sees while a cluster forms must not
        lower what an earlier host set).

        Raises BusClosedError when JetStream is unavailable or refuses the bucket (more
        replicas than servers, say), ValueError for a name JetStream does not accept.
        """
        self._check_open()
        config = KeyValueConfig(
            bucket=bucket, ttl=ttl, replicas=replicas, history=1, storage=StorageType.FILE
        )
        # Creating a replicated bucket waits for its peers; reads and writes must not.
        admin = self._nc.jetstream(timeout=_CREATE_TIMEOUT_S)
        try:
            try:
                await admin.create_key_value(config)
            except nats.js.errors.BadRequestError:  # it exists with another config
                info = await admin.stream_info(f"KV_{bucket}")
                info.config.max_age = ttl
                info.config.duplicate_window = min(ttl, 120.0) if ttl else 120.0
                had = info.config.num_replicas or 1
                info.config.num_replicas = max(had, replicas) if grow_only else replicas
                await admin.update_stream(info.config)
            js = self._nc.jetstream(timeout=_KV_TIMEOUT_S)
            kv = await js.key_value(bucket)
        except nats.js.errors.InvalidBucketNameError as exc:
            raise ValueError(f"invalid key-value bucket name {bucket!r}") from exc
        except nats.errors.Error as exc:
            raise BusClosedError(f"JetStream key-value bucket {bucket}: {exc!r}") from exc
        return NatsKeyValue(bucket, kv, self._check_open, js)

    def replay(
        self, subject: str, *, stream: str, since: float
    ) -> AbstractAsyncContextManager[BufferedSubscription]:
        """Subscribe to ``subject`` through JetStream ``stream``: what it kept from ``since``
        (epoch seconds) on, then live messages, in order. Raises ValueError, BusClosedError
        (also when the stream does not exist)."""
        check_pattern(subject)
        start = datetime.datetime.fromtimestamp(since, tz=datetime.UTC)
        return NatsSubscribing(self, subject, None, replay=(stream, start))

    async def aclose(self) -> None:
        """End every subscription and close the connection (flushing what is buffered)."""
        if self._closed:
            return
        self._closed = True
        self._end_subscriptions()
        self._lost()
        await self._close_client()

    def _family_of(self, subject: str) -> str | None:
        """The family (``<prefix>.*``) whose feed serves plain subscriptions to ``subject``:
        the wildcard itself or one subject under it, not a deeper one nor another wildcard."""
        if not self._families:
            return None
        prefix, dot, last = subject.rpartition(".")
        family = self._families.get(prefix + dot)
        if family is None or (last != "*" and ("*" in last or ">" in last)):
            return None
        return family

    def _check_subject(self, subject: str) -> None:
        if subject not in self._checked:
            check_subject(subject)
            if len(self._checked) >= _CHECKED_MAX:
                self._checked.clear()
            self._checked.add(subject)

    def _check_open(self) -> None:
        if self._closed:
            raise BusClosedError("bus is closed")

    async def _respond(self, reply: str, msg: Message) -> None:
        self._check_open()
        if not _is_inbox(reply):
            # A requester may name any subject as its reply-to; answering on a subject others
            # subscribe to (llmgw.events.>) would hand them the answer, a secret grant even.
            logger.warning("dropped a reply to %s: not an inbox", reply)
            return
        data = encode(msg)
        if self._nc.publish_now(reply, data):
            return
        try:
            await self._nc.publish(reply, data)
        except nats.errors.Error as exc:
            raise self._mapped(exc, "reply") from exc

    async def _barrier(self) -> None:
        # Returns once the server has processed every command sent before it (a SUB above
        # all), so a request from another connection right after finds this subscriber: a
        # message to a fresh inbox of ours, sent after those commands, comes back. Not
        # nc.flush(): nats-py writes its PING straight to the socket, ahead of commands still
        # queued for its flusher task, so the PONG can precede the SUB. Not a no-responders
        # request either: another client of the same user may listen on the whole prefix.
        inbox = self._nc.new_inbox()
        echo = await self._nc.subscribe(inbox, max_msgs=1)
        try:
            await self._nc.publish(inbox, b"")
            await echo.next_msg(timeout=_SUBSCRIBE_CONFIRM_S)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await echo.unsubscribe()

    def _mapped(self, exc: nats.errors.Error, what: str) -> GatewayError | ValueError:
        if isinstance(exc, nats.errors.NoRespondersError):
            return NoRespondersError(f"no responders: {what}")
        if isinstance(exc, nats.errors.MaxPayloadError):
            return ValueError(f"message too large for the NATS server: {what}")
        if isinstance(exc, nats.errors.BadSubjectError):
            return ValueError(f"invalid subject: {what}")
        if self._closed or self._nc.is_closed:
            return BusClosedError(f"bus closed: {what}")
        if isinstance(exc, nats.errors.TimeoutError):
            return RequestTimeoutError(f"no reply: {what}")
        if isinstance(exc, nats.errors.OutboundBufferLimitError):
            return BusClosedError(f"NATS unreachable and its outbound buffer is full: {what}")
        return BusClosedError(f"NATS failure ({type(exc).__name__}: {exc}): {what}")

    def _end_subscriptions(self) -> None:
        for sub in self._subs:
            sub.close()
        self._subs.clear()
        self._shared.clear()
        self._feeds.clear()

    async def _close_client(self) -> None:
        # Closed while reconnecting to a server that is gone, nats-py flushes what it buffered
        # into the transport it lost and uvloop raises RuntimeError: the client is closed for
        # good by then, and what it buffered could never have been delivered.
        try:
            await self._nc.close()
        except (nats.errors.Error, OSError, RuntimeError) as exc:
            logger.warning("closing the NATS connection: %r (what it buffered is dropped)", exc)

    async def _on_error(self, exc: Exception) -> None:
        if not self._joined:
            self._last_error = exc
            logger.debug("NATS: %r", exc)
            return
        logger.warning("NATS: %r", exc)

    async def _on_disconnected(self) -> None:
        self._lost()
        if not self._closed:
            logger.warning("NATS: disconnected; reconnecting")

    async def disconnected(self) -> None:
        """Return once the connection is lost: at once while it is (or the bus is closed),
        else at the next loss. nats-py fails no request in flight then: its reply may have
        been sent into the lost connection."""
        if self.connected:  # nats-py marks it lost before it calls _on_disconnected
            await self._gone.wait()

    def _lost(self) -> None:
        gone, self._gone = self._gone, asyncio.Event()
        gone.set()

    async def reconnected(self) -> None:
        """Return the next time the connection is back after a loss (subscriptions live
        again; what was published to them meanwhile never arrives)."""
        await self._back.wait()

    async def _on_reconnected(self) -> None:
        back, self._back = self._back, asyncio.Event()
        back.set()
        url = self._nc.connected_url  # netloc would carry the password: host and port only
        logger.info(
            "NATS: reconnected to %s:%s", url.hostname if url else "?", url.port if url else "?"
        )

    async def _on_closed(self) -> None:
        if not self._closed:
            logger.error("NATS: connection closed for good")
        self._closed = True
        self._end_subscriptions()
        self._lost()


def _family_prefix(family: str) -> str:
    """``family``'s prefix with its dot. Raises ValueError unless it reads ``<prefix>.*``."""
    check_pattern(family)
    prefix, dot, star = family.rpartition(".")
    if not dot or star != "*" or "*" in prefix or ">" in prefix:
        raise ValueError(f"a family is <prefix>.* without other wildcards, not {family!r}")
    return prefix + dot


def _expire(reply: asyncio.Future[bytes]) -> None:
    if not reply.done():
        reply.set_exception(nats.errors.TimeoutError())


def _describe(exc: BaseException) -> str:
    """``exc`` for a one-line message: its text (the OS's for a refused connection)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
