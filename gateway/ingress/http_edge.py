"""The HTTP/1.1 connection layer under the ingress: what Hypercorn's h11 protocol lets through
that the ASGI app cannot see.

:class:`EdgeH11Protocol` (installed by :func:`install`) refuses, before the app runs and
then closing the connection:

- a request framed both by ``Content-Length`` and ``Transfer-Encoding`` (RFC 9112 §6.3: the
  bytes a front end counts as body would be read here as a further, smuggled request);
- a head h11 would read leniently where another parser may not (:func:`head_refusal`): a
  ``Content-Length`` given twice or as a list (even of equal values), a header folded over
  lines (obs-fold, RFC 9112 §5.2) and a line ended by a bare LF (§2.2);
- a head not all sent within ``server.header_timeout_seconds`` (408, like a stalled body:
  Hypercorn alone would hold it until its keep-alive timeout and close without an answer);
- an HTTP version other than 1.x (h11 parses any ``HTTP/d.d``);
- a method not in upper case (methods are case-sensitive; Hypercorn would upper-case it).

It answers those refusals and the server's own errors (h11's 400, 431, 501) in the caller's
API shape, Anthropic's on ``/v1/messages…`` and OpenAI's elsewhere, with an ``x-request-id``.
And it closes a keep-alive connection as soon as the client ends it: Hypercorn alone leaves
it in CLOSE-WAIT until ``keep_alive_timeout``. :class:`EdgeTCPServer` waits out a connection's
keep-alive idle time on one task and the loop's shared deadline timer.

On HTTP/2, :class:`EdgeH2Protocol` keeps a connection up when a stream's request data arrives
after its answer is complete (the app may answer once the declared body is in, or refuse it
at once): Hypercorn alone fails on that data and tears down every stream of the connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any
from wsgiref.handlers import format_date_time

import h2.events
import h11
import hypercorn.asyncio.run
import hypercorn.protocol
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol, H11WSConnection

from gateway.http.deadline import deadline
from gateway.ingress.edge_refusals import (
    HEAD_END,
    HEADER_TIMEOUT,
    head_refusal,
    refusal_answer,
)

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

_SERVER_ERRORS = {
    400: ("malformed HTTP request", "invalid_request"),
    431: ("the request's header fields are too large", "request_too_large"),
    501: ("only Transfer-Encoding: chunked is supported", "invalid_request"),
}


def refusal(request: h11.Request) -> tuple[int, str] | None:
    """Why ``request`` is refused before the app sees it (status, message), or None."""
    if request.method == b"PRI" and request.target == b"*" and request.http_version == b"2.0":
        return None  # HTTP/2 with prior knowledge: Hypercorn switches protocol
    if not request.http_version.startswith(b"1."):
        version = request.http_version.decode("ascii")
        return 505, f"HTTP/{version} is not supported: use HTTP/1.1"
    if not request.method.isupper():
        method = request.method[:32].decode("ascii")
        return 400, f"the method {method!r} is not served: methods are upper-case"
    length = coding = False
    for name, _ in request.headers:  # names come lower-cased
        if name == b"content-length":
            length = True
        elif name == b"transfer-encoding":
            coding = True
    if length and coding:
        return 400, "a request with both Content-Length and Transfer-Encoding is refused"
    return None


class _Refused(H11WSConnection):
    """Stands in for the h11 connection once a request is refused: it parses nothing more,
    so no request behind the refused one is ever served (as Hypercorn's own stand-in does
    for a WebSocket's bytes)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def receive_data(self, data: bytes) -> None:
        pass

    def next_event(self) -> type[h11.NEED_DATA]:
        return h11.NEED_DATA

    def send(self, event: object) -> bytes:
        return b""


class _FramedConnection(h11.Connection):
    """h11's server side, refusing a head :func:`head_refusal` refuses before parsing it, and
    telling ``head_begun`` (with the bytes so far) when a head has begun but not ended."""

    refusal: str | None = None
    head_begun: Callable[[bytes], None] | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        if self.their_state is h11.IDLE and self.refusal is None:
            pending = self.trailing_data[0]
            end = HEAD_END.search(pending)
            if end is not None:
                self.refusal = head_refusal(pending[: end.end()])
                if self.refusal is not None:
                    raise h11.RemoteProtocolError(self.refusal, error_status_hint=400)
            elif pending and self.head_begun is not None:
                # Part of a head is here, whether it came alone or behind an answered
                # request (pipelined): its time runs.
                self.head_begun(pending)
        return super().next_event()


class EdgeConfig(HypercornConfig):
    """Hypercorn's settings plus the edge's own (one object per server). Reads the wall
    clock through ``wall``.

    ``response_headers(protocol)``, Hypercorn's headers for every answer (``date``,
    ``server``), is a lookup in :attr:`stamped` (:class:`StampedHeaders`): Hypercorn formats
    the date anew for each answer, yet it changes once a second. The list is shared: callers
    must not change it (Hypercorn's copy or extend their own). The server's owner calls
    ``stamped.stop()`` once the server is done."""

    header_timeout: float = HEADER_TIMEOUT
    wall: Callable[[], float] = staticmethod(time.time)

    def __init__(self) -> None:
        self.stamped = StampedHeaders(self._headers_at, self._now)
        # An instance attribute over the method: the dict's own lookup (C), no Python frame.
        self.response_headers = self.stamped.__getitem__  # type: ignore[method-assign,assignment]

    def _now(self) -> float:
        return self.wall()

    def _headers_at(self, protocol: str, second: int) -> list[tuple[bytes, bytes]]:
        return [
            (name, value) if name != b"date" else (name, _http_date(second))
            for name, value in HypercornConfig.response_headers(self, protocol)
        ]


class StampedHeaders(dict[str, list[tuple[bytes, bytes]]]):
    """protocol -> the headers of every answer in the current second (``make(protocol,
    second)``, the second read from ``wall``). The first answer for a protocol makes them (a
    miss) and starts a timer that makes them again at the turn of each second (:meth:`tick`)
    until :meth:`stop`: one timer a second while the server runs, none per answer. Outside a
    running event loop, or once stopped, a miss makes them and keeps nothing."""

    __slots__ = ("_make", "_stopped", "_ticker", "_wall")

    def __init__(
        self,
        make: Callable[[str, int], list[tuple[bytes, bytes]]],
        wall: Callable[[], float],
    ) -> None:
        super().__init__()
        self._make = make
        self._wall = wall
        self._ticker: asyncio.TimerHandle | None = None
        self._stopped = False

    def __missing__(self, protocol: str) -> list[tuple[bytes, bytes]]:
        now = self._wall()
        headers = self._make(protocol, int(now))
        if self._stopped:
            return headers
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return headers
        self[protocol] = headers
        if self._ticker is None:
            self._ticker = loop.call_later(int(now) + 1 - now, self.tick)
        return headers

    def tick(self) -> None:
        """The second turned: make every protocol's headers for the new one, and wait for
        the next turn (what the timer runs; needs a running event loop)."""
        now = self._wall()
        for protocol in self:
            self[protocol] = self._make(protocol, int(now))
        self._ticker = asyncio.get_running_loop().call_later(int(now) + 1 - now, self.tick)

    def stop(self) -> None:
        """Stop the timer and keep nothing from now on (idempotent)."""
        self._stopped = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self.clear()


def _http_date(second: int) -> bytes:
    return format_date_time(second).encode("ascii")


class EdgeH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol with the refusals, error bodies, head timeout and prompt
    close this module describes."""

    _head: bytes | None = None  # the first bytes of the request being read (for its path)
    _refused: tuple[int, str] | None = None  # why the request being read is refused
    _head_timer: asyncio.TimerHandle | None = None  # armed while a head is being read
    _head_epoch = 0  # moves on each arming and disarming: a late-firing timer sees it moved
    _timed_out = False  # a head timed out: the connection only closes from then on

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection = _FramedConnection(
            h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size
        )
        self.connection.head_begun = self._head_begun

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData):
            if self._timed_out:
                return
            if self.stream is None and self._head is None:
                self._head = event.data
        elif isinstance(event, Closed):
            self._disarm_head_timer()
            if self.stream is None:
                # The client ended an idle connection: close ours now (Hypercorn would keep
                # it until its idle timer fires).
                await self.send(Closed())
                return
        await super().handle(event)

    def _head_begun(self, pending: bytes) -> None:
        """A head has begun and not ended (the connection's reading found it so): time it.
        A head that arrives whole is parsed at once and never timed."""
        self._head = self._head or pending
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and isinstance(self.connection, h11.Connection):
            timeout = (
                self.config.header_timeout
                if isinstance(self.config, EdgeConfig)
                else HEADER_TIMEOUT
            )
            self._head_epoch += 1
            self._head_timer = asyncio.get_running_loop().call_later(
                timeout, self.task_group.spawn, self._head_expired, timeout, self._head_epoch
            )

    def _disarm_head_timer(self) -> None:
        self._head_epoch += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    async def _head_expired(self, timeout: float, epoch: int) -> None:
        """The head being read did not arrive in time: 408 in the caller's shape, and close."""
        if epoch != self._head_epoch:
            return  # the head arrived (or the connection ended) after the timer fired
        self._head_timer = None
        conn = self.connection
        if self.stream is not None or not isinstance(conn, h11.Connection):
            return
        if conn.their_state is not h11.IDLE or HEAD_END.search(conn.trailing_data[0]):
            # The whole head did arrive: a busy loop ran this timer before the request was
            # dispatched. Closing now would drop a request the client sent in time.
            return
        self._timed_out = True
        if self.connection.our_state is h11.IDLE:
            message = f"the request head did not arrive within {timeout:g} seconds"
            await self._answer_error(408, message, "request_timeout", self._target())
        self.connection = _Refused()
        await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        # Hypercorn calls this, then _create_stream, for each request: a refused request is
        # neither upgraded (h2c) nor served.
        self._disarm_head_timer()
        self._refused = refusal(event)
        if self._refused is None:
            await super()._check_protocol(event)

    async def _create_stream(self, request: h11.Request) -> None:
        self._head = None
        if self._refused is None:
            await super()._create_stream(request)
            return
        status, message = self._refused
        await self._answer_error(status, message, "invalid_request", request.target)
        self.connection = _Refused()
        await self.send(Closed())

    async def _send_error_response(self, status_code: int) -> None:
        # h11 could not parse the request, or the head was refused before it tried
        # (Hypercorn sends a bodiless answer and closes).
        self._disarm_head_timer()
        message, code = _SERVER_ERRORS.get(status_code, _SERVER_ERRORS[400])
        message = getattr(self.connection, "refusal", None) or message
        await self._answer_error(status_code, message, code, self._target())

    def _target(self) -> bytes:
        """The request-target of the request that failed, as far as it is known."""
        scope = getattr(self.stream, "scope", None)
        if scope is not None:
            return bytes(scope["raw_path"])
        parts = (self._head or b"").split(b" ", 2)
        return parts[1] if len(parts) > 1 else b""

    async def _answer_error(self, status: int, message: str, code: str, target: bytes) -> None:
        headers, body = refusal_answer(status, message, code, target)
        headers += self.config.response_headers("h11")
        await self._send_h11_event(h11.Response(status_code=status, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class EdgeTCPServer(TCPServer):
    """Hypercorn's asyncio connection, waiting out its keep-alive idle time more cheaply.
    Hypercorn restarts that wait each time an answer ends and cancels it when the next
    request begins. Its wait is ``asyncio.wait_for`` on the server's termination: a second
    task and a loop timer for every request. Here the wait is the idle task alone, bounded
    by a deadline on the loop's shared timer (at most one 10 ms tick late, on a timeout of
    seconds). The connection still closes when the server terminates or the time is up."""

    async def _idle_timeout(self) -> None:
        try:
            with deadline(self.config.keep_alive_timeout):
                await self.context.terminated.wait()
        except TimeoutError:
            pass
        await asyncio.shield(self._initiate_server_close())


class EdgeH2Protocol(H2Protocol):
    """Hypercorn's HTTP/2 protocol, taking request data for a stream it has already closed,
    and idle from its start.

    The client may still be sending a stream's body (or the empty frame that ends it) when
    the stream's answer is complete: the gateway answers once the declared ``Content-Length``
    is in, and refuses an oversized body before reading it. Hypercorn ignores such a stream's
    end but looks the stream up for its data, fails, and closes the connection with all its
    other streams. Here that data is acknowledged (its flow-control credit given back) and
    dropped.

    A connection with prior knowledge (h2c) opens as HTTP/1.1, whose parser reads the
    preface as a request and stops the keep-alive wait; Hypercorn's HTTP/2 side restarts it
    only when a stream closes. So a connection that never opened a stream (or sent junk
    after the preface) was held open for good. Here it is idle as soon as it is HTTP/2 with
    no stream, and closes at its keep-alive time like any idle connection."""

    async def initiate(
        self, headers: list[tuple[bytes, bytes]] | None = None, settings: bytes | None = None
    ) -> None:
        await super().initiate(headers, settings)
        if not self.streams:  # an upgraded request (h2c ``Upgrade``) is a stream under way
            await self.send(Updated(idle=True))

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # One at a time: a stream is created by an event of the same batch as its data.
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                if event.flow_controlled_length:
                    self.connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                continue
            await super()._handle_events([event])


def install() -> None:
    """Serve HTTP/1.1 with :class:`EdgeH11Protocol` and HTTP/2 with :class:`EdgeH2Protocol` on
    :class:`EdgeTCPServer` connections from now on, in this process. Raises RuntimeError if
    this Hypercorn's protocols or connection lack what the subclasses hook into."""
    hooks = (
        "handle",
        "_check_protocol",
        "_create_stream",
        "_send_error_response",
    )
    for hook in (*hooks, "_send_h11_event"):
        if not hasattr(H11Protocol, hook):
            raise RuntimeError(f"unsupported Hypercorn version: H11Protocol has no {hook}")
    for hook in ("_handle_events", "initiate"):
        if not hasattr(H2Protocol, hook):
            raise RuntimeError(f"unsupported Hypercorn version: H2Protocol has no {hook}")
    for hook in ("_idle_timeout", "_initiate_server_close"):
        if not hasattr(TCPServer, hook):
            raise RuntimeError(f"unsupported Hypercorn version: TCPServer has no {hook}")
    # ProtocolWrapper picks each protocol by these module-level names per connection, and
    # Hypercorn's asyncio server its connection class by the last one.
    hypercorn.protocol.H11Protocol = EdgeH11Protocol  # type: ignore[attr-defined]
    hypercorn.protocol.H2Protocol = EdgeH2Protocol  # type: ignore[attr-defined]
    hypercorn.asyncio.run.TCPServer = EdgeTCPServer  # type: ignore[attr-defined]
