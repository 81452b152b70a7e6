"""One client connection of the builtin engine: HTTP/1.1 read by llhttp (``httptools``),
each request served by the ASGI app on a task of its own, one at a time in order.

:class:`Connection` owns the connection's parser, the exchange being served and those
pipelined behind it, the head timer and the reading and writing flow control. Before the app
runs it refuses, in the caller's API shape (``gateway.ingress.edge_refusals.surface_of``) with an
``x-request-id``, then closing the connection: what llhttp will not parse (both
``Content-Length`` and ``Transfer-Encoding``, a repeated or listed ``Content-Length``,
obs-fold, a bare LF, a malformed or lower-case method, garbage), an HTTP version other than
1.x (505), a transfer coding other than chunked (501), a head over :data:`MAX_HEAD_BYTES`
(431) and a head not all arrived within the header timeout (408), and a chunked body that
breaks its framing (400). An ``Upgrade`` is not taken: the request, its body included, is
served as HTTP/1.1 (RFC 9110 §7.8) on a connection kept as any other. A connection that opens
with HTTP/2's preface is handed to ``gateway.process.h1.h2_handoff``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import httptools

from gateway.ingress.edge_refusals import CHUNKED_LAST, head_refusal, refusal_answer
from gateway.process.h1.cycle import Exchange

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from gateway.process.h1.server import ServerState

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client speaking HTTP/2 with prior knowledge sends first (RFC 9113 §3.4)."""
MAX_HEAD_BYTES = 16 * 1024  # as Hypercorn's h11 (its max_incomplete_event_size)
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_MALFORMED = (400, "malformed HTTP request", "invalid_request")
_TOO_LARGE = "the request's header fields are too large"
_BOTH_FRAMINGS = "a request with both Content-Length and Transfer-Encoding is refused"
_ONLY_CHUNKED = (501, "only Transfer-Encoding: chunked is supported", "invalid_request")
_BAD_CHUNKS = "the request body's chunked framing is malformed"
_FRAMING = (b"content-length", b"transfer-encoding")


class _HeadTooLargeError(Exception):
    """The head being read is over MAX_HEAD_BYTES."""


class Connection(asyncio.Protocol):
    """A client connection; ``state`` is what the server's connections share (the app, the
    settings, the date header, the set of live connections)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = state.loop
        self.writing_paused = False
        self.idle_since: float | None = None
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._head_data = b""  # the bytes of the head being read (its size, its refusal)
        self._reading = False  # a head is being read
        self._parsing: Exchange | None = None  # the exchange whose request is being read
        self._serving: Exchange | None = None  # the exchange the app has
        self._queued: deque[Exchange] | None = None  # pipelined behind it
        self._head_timer: asyncio.TimerHandle | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._read_paused = False
        self._closing = False
        self._framing_only = False  # the head being parsed is one made to read a body
        self._head_began_alone = True  # no request's bytes came before the head's in its data
        self._refusal: tuple[int, str, str] | None = None  # to answer once the one ahead is
        self._opening: bytes | None = b""  # the first bytes, until HTTP/2's preface is ruled out

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = transport = cast("asyncio.Transport", transport)
        self._client = _address(transport.get_extra_info("peername"))
        self._server = _address(transport.get_extra_info("sockname"))
        self.state.connections.add(self)
        self.idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._opening is not None:
            data = self._opening + data
            if len(data) < len(PREFACE) and PREFACE.startswith(data):
                self._opening = data  # maybe HTTP/2: wait for the whole preface (or a head)
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(
                        self.state.header_timeout, self._head_expired
                    )
                return
            self._opening = None
            self._cancel_head_timer()
            if data.startswith(PREFACE):
                self._hand_over(data)
                return
        continued = self._reading  # a head begun in earlier data goes on in this
        if continued:
            self._head_data += data
        try:
            self._feed(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _HeadTooLargeError):
                raise
            self._refuse(431, _TOO_LARGE, "request_too_large")
            return
        except httptools.HttpParserError as exc:
            if self._parsing is not None:  # the head was whole: its body broke the framing
                self._refuse(400, _BAD_CHUNKS, "invalid_request")
            else:
                # llhttp stopped before the target's end (a lower-case method, a raw byte in
                # it): the refusal's API shape is read off the request line as sent.
                self._url = self._url or _target_of(self._head_data if continued else data)
                self._refuse(*self._why_refused(data, exc))
            return
        if self._reading:
            if not continued:
                # This data holds the head's start; after an earlier request's end, too.
                self._head_data = data if self._head_began_alone else b""
            if len(self._head_data) > MAX_HEAD_BYTES:
                self._refuse(431, _TOO_LARGE, "request_too_large")
                return
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self.state.header_timeout, self._head_expired
                )

    def _feed(self, data: bytes) -> None:
        """Parse ``data``. Raises httptools.HttpParserError (a callback's failure, too)."""
        while True:
            try:
                self._parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                # llhttp stops at the end of the head of a request asking to upgrade (h2c,
                # websocket) and httptools skips its body. The upgrade is not taken (RFC
                # 9110 §7.8 lets a server ignore it): a fresh parser reads on as HTTP/1.1,
                # first that body as the request's own framing headers say, then whatever
                # follows it, as on any connection.
                data = data[int(upgrade.args[0]) :]
                self._parser = httptools.HttpRequestParser(self)
                if self._closing or self._parsing is None:
                    return  # refused (its answer closes the connection): read no more
                framing = [b"%b: %b\r\n" % h for h in self._headers if h[0] in _FRAMING]
                self._framing_only = True  # on_message_begin .. on_headers_complete skip it
                self._parser.feed_data(b"POST / HTTP/1.1\r\n%b\r\n" % b"".join(framing))

    def eof_received(self) -> bool | None:
        # The client is done sending: it will not read an answer either (HTTP clients do not
        # half-close), so the connection closes now (not at its keep-alive timeout) and an
        # app still answering hears ``http.disconnect``, as under Hypercorn.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.state.forget(self)
        self._cancel_head_timer()
        for exchange in (self._serving, self._parsing, *(self._queued or ())):
            if exchange is not None:
                exchange.client_gone()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        waiter = self._drain_waiter
        if waiter is not None:
            self._drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- llhttp's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._framing_only:
            return
        self._head_began_alone = self._parsing is None and self._serving is None
        self._reading = True
        self.idle_since = None
        self._url = b""
        self._headers = []
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        if self._framing_only:
            return
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._framing_only:
            return
        self._headers.append((name.lower(), value))
        self._grow_head(len(name) + len(value))

    def _grow_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            raise _HeadTooLargeError

    def on_headers_complete(self) -> None:
        if self._framing_only:
            self._framing_only = False  # the body that follows is the upgrade request's
            return
        if self._closing:
            return
        self._reading = False
        self._head_data = b""
        self._cancel_head_timer()
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._refuse(505, f"HTTP/{version} is not supported: use HTTP/1.1", "invalid_request")
            return
        expect_continue = False
        for name, value in self._headers:
            if name == b"transfer-encoding" and value.lower() != b"chunked":
                self._refuse(*_ONLY_CHUNKED)
                return
            if name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        raw = self._url
        path, _, query = raw.partition(b"?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1"),
            "raw_path": path,
            "query_string": query,
            "headers": self._headers,
        }
        exchange = Exchange(
            self,
            scope,
            keep_alive=parser.should_keep_alive() and not self.state.stopping,
            expect_continue=expect_continue,
        )
        self._parsing = exchange
        if self._serving is None:
            self._start(exchange)
            return
        if self._queued is None:
            self._queued = deque()
        self._queued.append(exchange)
        self.pause_reading()  # one request ahead is enough: the rest waits in the socket

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.body_received(body)

    def on_message_complete(self) -> None:
        exchange = self._parsing
        if exchange is not None and not self._parser.should_upgrade():
            # (A request asking to upgrade ends here without its body: see _feed.)
            self._parsing = None
            exchange.body_ended()

    # -- serving --------------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self._serving = exchange
        call = self.state.app(exchange.scope, exchange.receive, exchange.send)
        task = self.loop.create_task(cast("Coroutine[Any, Any, None]", call))
        self.state.serving.add(task)
        task.add_done_callback(lambda done: self._app_returned(exchange, done))

    def _app_returned(self, exchange: Exchange, task: asyncio.Task[None]) -> None:
        self.state.serving.discard(task)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            logger.error("the app raised serving a request", exc_info=failure)
        if exchange.response_complete:
            return
        if not exchange.response_started and not exchange.disconnected:
            self._answer_error(500, "the gateway failed to answer", "internal_error")
        self.close()

    def exchange_done(self, exchange: Exchange) -> None:
        """``exchange``'s answer is all written: serve the next request or close."""
        if exchange is not self._serving:
            return
        self._serving = None
        if not exchange.keep_alive or not exchange.body_complete or self.state.stopping:
            # A body still arriving would be read as the next request: close instead.
            self.close()
            return
        if self._queued:
            self._start(self._queued.popleft())
            if not self._queued:
                self.resume_reading()
            return
        if self._refusal is not None:  # a request behind this one was refused
            self._answer_error(*self._refusal)
            self.close()
        else:
            self.idle_since = self.loop.time()
            self.resume_reading()

    def _hand_over(self, data: bytes) -> None:
        # HTTP/2: the handoff serves the transport from here; this protocol is done with it.
        assert self._transport is not None
        self._closing = True
        self.state.forget(self)
        self.state.handoff().take(self._transport, data)

    # -- writing and flow control ---------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write ``data`` (nothing once the connection is closing)."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def drained(self) -> None:
        """Wait until the write buffer is below its high-water mark again (or the
        connection ended)."""
        if not self.writing_paused or self._closing:
            return
        if self._drain_waiter is None:
            self._drain_waiter = self.loop.create_future()
        await self._drain_waiter

    def pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._read_paused and self._transport is not None and not self._closing:
            self._read_paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        """Close once what is written is sent (idempotent)."""
        self._closing = True
        self._cancel_head_timer()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def close_if_idle(self) -> bool:
        """Close now if no request is being read or served; whether it closed."""
        if self._serving is None and self._parsing is None and not self._reading:
            self.close()
            return True
        return False

    # -- refusals -------------------------------------------------------------------------

    def _why_refused(self, data: bytes, exc: Exception) -> tuple[int, str, str]:
        text = str(exc)
        if "Content-Length" in text and "Transfer-Encoding" in text:
            return 400, _BOTH_FRAMINGS, "invalid_request"
        if "Transfer-Encoding" in text:  # llhttp takes what ends in chunked, applied once
            return 400, CHUNKED_LAST, "invalid_request"
        if isinstance(exc, httptools.HttpParserInvalidMethodError):
            token = (self._head_data or data).split(b" ", 1)[0][:32]
            if token.isalpha() and token.isascii() and not token.isupper():
                method = token.decode("ascii")
                why = f"the method {method!r} is not served: methods are upper-case"
                return 400, why, "invalid_request"
            return _MALFORMED
        if "PRI" in text:
            return 505, "HTTP/2 is not spoken by this server: use HTTP/1.1", "invalid_request"
        if "HTTP version" in text:
            version = self._parser.get_http_version()
            return 505, f"HTTP/{version} is not supported: use HTTP/1.1", "invalid_request"
        head = self._head_data or data
        return 400, head_refusal(head) or _MALFORMED[1], "invalid_request"

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Refuse the request being read and close; a request ahead of it is answered
        first (its answer, then the refusal)."""
        self._reading = False
        broken, self._parsing = self._parsing, None  # a request whose body was being read
        self._cancel_head_timer()
        if broken is not None and self._queued and self._queued[-1] is broken:
            self._queued.pop()  # never served: its body will not end
        elif broken is not None and broken is self._serving and not broken.response_started:
            # The app has it, waiting for its body: the refusal is the answer (the app hears
            # the client go, and what it sends is dropped).
            broken.body_refused()
            self._answer_error(status, message, code)
            self.close()
            return
        if self._serving is not None:
            self._closing = True  # read nothing more
            self._refusal = (status, message, code)
            return
        self._answer_error(status, message, code)
        self.close()

    def _head_expired(self) -> None:
        self._head_timer = None
        if not (self._reading or self._opening) or self._closing:
            return
        timeout = self.state.header_timeout
        message = f"the request head did not arrive within {timeout:g} seconds"
        self._refuse(408, message, "request_timeout")

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _answer_error(self, status: int, message: str, code: str) -> None:
        headers, body = refusal_answer(status, message, code, self._url)
        lines = [f"HTTP/1.1 {status} {_PHRASES.get(status, '')}\r\n".encode("ascii")]
        lines += [b"%b: %b\r\n" % header for header in headers]
        self.write(b"".join(lines) + self.state.date_header + b"\r\n" + body)


def _target_of(head: bytes) -> bytes:
    """The request target of a request line as sent (b"" when it has none)."""
    parts = head.split(b"\n", 1)[0].split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


def _address(name: Any) -> tuple[str, int] | None:
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    return None


_PHRASES = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
}

__all__ = ["MAX_HEAD_BYTES", "Connection"]
