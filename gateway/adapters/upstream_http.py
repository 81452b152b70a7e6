"""The pooled upstream HTTP client every adapter shares: HTTP/1.1 on ``asyncio.Protocol``.

Measured before choosing (tests/benchmarks/README.md, ``request_cost``): aiohttp's client did
much the gateway never uses (cookies, redirects, proxies, auth, payload machinery, trace hooks,
a timer context per request) and was about a quarter of the event loop's Python time; this one
took a plain request from 1.37 M instructions to 1.01 M. It keeps what the adapters need: a
keep-alive pool per origin (a total limit of connections in use, idle ones closed after
``keepalive_seconds``), TLS with the default context, the read timeout as the longest gap
between arrivals, Content-Length, chunked and close-delimited answers, gzip and deflate. It
sends no cookies, follows no redirects and reads no proxy from the environment. Transport
failures come out as ``UpstreamError`` (timeouts as ``UpstreamTimeoutError``); a malformed
answer is a ``transport`` failure. A whole answer's body is bounded (``max_answer_bytes``, as
received and as inflated), an error answer's by ``http1.ERROR_BODY_MAX``: one over its bound
is the upstream's bad response (``UpstreamBadResponseError``), read no further.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from gateway.adapters.http1 import (
    NO_HEADERS,
    WAITING_HEAD,
    AnswerTooLargeError,
    Http1Connection,
    MalformedAnswerError,
)
from gateway.http import busy_poll
from schemas import UpstreamBadResponseError, UpstreamError, UpstreamTimeoutError
from schemas.process_config import MAX_UPSTREAM_ANSWER_BYTES

if TYPE_CHECKING:
    from collections.abc import Mapping
    from contextlib import AbstractAsyncContextManager

    from yarl import URL

_Origin = tuple[str, str, int]  # scheme, host, port: what one pool of connections serves

# Distinct URLs seen (a route's are fixed by its config, so a handful); past this many
# (configs churned by reloads), the memo starts over.
_TARGETS_MAX = 1024
# What aiohttp sent: upstreams answer as they did (Accept-Encoding: the two decoded here).
_DEFAULTS = (
    ("\naccept:", "Accept: */*\r\n"),
    ("\naccept-encoding:", "Accept-Encoding: gzip, deflate\r\n"),
    ("\nuser-agent:", "User-Agent: llmgw\r\n"),
)
_TARGET_SAFE = "-._~!$&'()*+,;=:@/?%"  # what a request target may hold besides letters and digits
_TARGET_OK = re.compile(rf"[A-Za-z0-9{re.escape(_TARGET_SAFE)}]+")


class _ConnectError(OSError):
    """The connection could not be made (refused, unresolvable, TLS handshake)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole upstream answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def transport_error(endpoint: str, exc: BaseException) -> UpstreamError:
    """Map a transport failure (timeout, refused, reset, malformed) to an UpstreamError; an
    answer over its bound to an UpstreamBadResponseError (no HTTP answer is one that big)."""
    if isinstance(exc, AnswerTooLargeError):
        return UpstreamBadResponseError(
            f"upstream returned an invalid response: {exc}",
            endpoint=endpoint,
            status=None,
            kind="bad_response",
        )
    if isinstance(exc, TimeoutError):
        return UpstreamTimeoutError(
            f"upstream did not answer in time ({type(exc).__name__})",
            endpoint=endpoint,
            kind="timeout",
        )
    kind = "connect" if isinstance(exc, _ConnectError) else "transport"
    # Our own failures say what went wrong; an OS error only its kind (no addresses).
    detail = (
        str(exc) if isinstance(exc, (_ConnectError, MalformedAnswerError)) else type(exc).__name__
    )
    return UpstreamError(f"upstream connection failed ({detail})", endpoint=endpoint, kind=kind)


def _send(
    conn: Http1Connection, data: bytes, timeout: float, whole: bool, limit: int
) -> asyncio.Future[None]:
    """Write one request on ``conn``; the future its answer wakes (see ``Http1Connection``).
    ``limit``: the bound on a whole answer's body (0: none)."""
    loop = conn.loop  # not asyncio.get_running_loop(): on 3.11 each call is a getpid()
    conn.last = now = loop.time()
    conn.state, conn.whole, conn.timeout, conn.complete = WAITING_HEAD, whole, timeout, False
    conn.limit = limit
    conn.error, conn.status, conn.encoding, conn.pieces, conn.buf = None, 0, None, [], b""
    # One timer per connection, kept armed across requests: it re-arms itself while data
    # keeps arriving and lapses on an idle connection. Re-armed here only when sooner.
    if conn.timer is None or conn.timer_at > now + timeout:
        if conn.timer is not None:
            conn.timer.cancel()
        conn.timer_at = now + timeout
        conn.timer = loop.call_at(conn.timer_at, conn.on_timer)
    conn.waiter = waiter = loop.create_future()
    assert conn.transport is not None
    conn.transport.write(data)
    poller = busy_poll.pollers.get(loop)
    if poller is not None:  # the answer may come before an idle core would wake
        poller.hold()
    return waiter


def _take(conn: Http1Connection) -> bytes:
    """The body bytes ``conn`` received and nobody took yet, as one piece."""
    pieces, conn.pieces = conn.pieces, []
    if not conn.whole:
        conn.taken()
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class StreamAnswer:
    """An upstream answer still arriving: status and headers once entered (the context
    :meth:`UpstreamHTTP.stream` returns), the body in pieces. On exit a fully read
    connection goes back to the pool; a half-read one is closed, so an abandoned stream's
    upstream sees its client go away. Raises UpstreamError for transport failures."""

    __slots__ = (
        "_conn",
        "_data",
        "_endpoint",
        "_http",
        "_target",
        "_timeouts",
        "headers",
        "status",
    )

    def __init__(
        self,
        http: UpstreamHTTP,
        endpoint: str,
        target: tuple[_Origin, str],
        data: bytes,
        timeouts: tuple[float, float],
    ) -> None:
        self._http, self._endpoint, self._target = http, endpoint, target
        self._data, self._timeouts = data, timeouts
        self._conn: Http1Connection | None = None
        self.status = 0
        self.headers: Mapping[str, str] = NO_HEADERS

    async def __aenter__(self) -> StreamAnswer:
        timeout, connect_timeout = self._timeouts
        conn = await self._http._exchange(
            self._endpoint, self._target[0], self._data, timeout, connect_timeout, False
        )
        self._conn, self.status, self.headers = conn, conn.status, conn.headers
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._http._release(conn)

    async def read(self) -> bytes:
        """The rest of the body (of an error answer: bounded by ``http1.ERROR_BODY_MAX``).
        Raises UpstreamError (UpstreamBadResponseError past the bound)."""
        return b"".join([piece async for piece in self])

    def chunks(self) -> StreamAnswer:
        """The body as it arrives. Raises UpstreamError when the connection breaks."""
        return self

    def __aiter__(self) -> StreamAnswer:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        while conn is not None:
            if conn.pieces:
                return _take(conn)
            if conn.error is not None:
                raise transport_error(self._endpoint, conn.error)
            if conn.complete:
                break
            conn.waiter = waiter = asyncio.get_running_loop().create_future()
            await waiter
        raise StopAsyncIteration


class UpstreamHTTP:
    """Owns the pooled connections to every upstream origin (opened inside the running event
    loop), the TLS context and a memo of the URLs it was asked for. ``max_answer_bytes``: the
    bound on a whole (not streamed) answer's body, as received and as inflated (settable: a
    reload changes it for the next request)."""

    def __init__(
        self,
        *,
        limit: int = 1000,
        keepalive_seconds: float = 30.0,
        max_answer_bytes: int = MAX_UPSTREAM_ANSWER_BYTES,
    ) -> None:
        self._limit = limit
        self._keepalive = keepalive_seconds
        self.max_answer_bytes = max_answer_bytes
        self._idle: dict[_Origin, list[Http1Connection]] = {}
        self._conns: set[Http1Connection] = set()  # every open one, to close them all
        self._busy = 0  # connections in use or being opened, at most ``limit``
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._targets: dict[str | URL, tuple[_Origin, str]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self,
        endpoint: str,
        url: str | URL,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
    ) -> Answer:
        """POST and read the whole answer. Raises UpstreamError for transport failures."""
        origin, head = self._targets.get(url) or self._target(endpoint, url)
        data = _request(f"POST {head}", headers, body)
        conn = await self._exchange(endpoint, origin, data, timeout, connect_timeout, True)
        answer = Answer(conn.status, conn.headers, _take(conn))
        self._release(conn)
        return answer

    def stream(
        self,
        endpoint: str,
        url: str | URL,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
    ) -> AbstractAsyncContextManager[StreamAnswer]:
        """POST and yield the answer as it arrives; the connection is released on exit.
        Raises UpstreamError for transport failures (on entry, or while reading)."""
        target = self._targets.get(url) or self._target(endpoint, url)
        data = _request(f"POST {target[1]}", headers, body)
        return StreamAnswer(self, endpoint, target, data, (timeout, connect_timeout))

    async def get_status(self, url: str, *, timeout: float) -> int | None:
        """GET ``url``; its status, or None when it did not answer."""
        try:
            return (await self.get(url, url, {}, timeout=timeout)).status
        except UpstreamError:
            return None

    async def get(
        self, endpoint: str, url: str, headers: Mapping[str, str], *, timeout: float
    ) -> Answer:
        """GET ``url`` and read the whole answer within ``timeout`` (all of it). Raises
        UpstreamError for transport failures."""
        origin, head = self._targets.get(url) or self._target(endpoint, url)
        data = _request(f"GET {head}", headers, None)
        try:
            async with asyncio.timeout(timeout):
                for retry in (True, False):
                    reused = bool(self._idle.get(origin))
                    try:
                        conn = await self._exchange(endpoint, origin, data, timeout, timeout, True)
                    except UpstreamError as exc:
                        # A kept-alive connection the upstream had just closed: GET may go
                        # again once on a new one, as aiohttp did for idempotent methods.
                        if retry and reused and exc.kind == "transport":
                            continue
                        raise
                    answer = Answer(conn.status, conn.headers, _take(conn))
                    self._release(conn)
                    return answer
        except TimeoutError as exc:
            raise transport_error(endpoint, exc) from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close every connection; the client may still be used afterwards."""
        for conn in list(self._conns):
            conn.close()
        self._idle.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    async def _exchange(
        self,
        endpoint: str,
        origin: _Origin,
        data: bytes,
        timeout: float,
        connect_timeout: float,
        whole: bool,
    ) -> Http1Connection:
        """Send ``data`` on a pooled (else new) connection and wait for the answer's head
        (``whole``: all of it); the connection, held until ``_release``. Raises
        UpstreamError."""
        if self._busy >= self._limit or self._waiters:
            await self._slot()
        self._busy += 1
        conn = None
        stack = self._idle.get(origin)
        while stack:
            conn = stack.pop()
            if not conn.closed and conn.loop.time() - conn.last < self._keepalive:
                break
            conn.close()
            conn = None
        if conn is None:
            loop = asyncio.get_running_loop()
            conn = await self._connect(endpoint, loop, origin, connect_timeout)
        conn.no_body = data.startswith(b"HEAD ")
        try:
            await _send(conn, data, timeout, whole, self.max_answer_bytes if whole else 0)
        except BaseException:  # cancelled: the upstream must see its client go
            self._release(conn)
            raise
        if conn.error is not None:
            self._release(conn)
            raise transport_error(endpoint, conn.error)
        return conn

    async def _connect(
        self,
        endpoint: str,
        loop: asyncio.AbstractEventLoop,
        origin: _Origin,
        connect_timeout: float,
    ) -> Http1Connection:
        scheme, host, port = origin
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Http1Connection(loop, origin, self._conns),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
        except BaseException as exc:
            self._give_back()
            if isinstance(exc, TimeoutError):
                raise transport_error(endpoint, exc) from None
            if isinstance(exc, OSError):  # refused, unresolvable, TLS (ssl.SSLError)
                raise transport_error(endpoint, _ConnectError(type(exc).__name__)) from None
            raise
        return conn

    def _release(self, conn: Http1Connection) -> None:
        """Pool a connection whose answer was read to its end and may be kept; close any
        other."""
        if conn.complete and conn.keep_alive and not conn.closed:
            stack = self._idle.get(conn.origin)
            if stack is None:
                stack = self._idle[conn.origin] = []
            stack.append(conn)
            if self._sweep is None:
                self._sweep = asyncio.get_running_loop().call_at(
                    conn.last + self._keepalive, self._expire
                )
        else:
            conn.close()
        self._give_back()

    def _give_back(self) -> None:
        self._busy -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def _slot(self) -> None:
        """Wait, in turn, until fewer than ``limit`` connections are in use."""
        while self._busy >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_next()  # woken, then cancelled: the turn passes on
                raise

    def _expire(self) -> None:
        """Close the connections idle for ``keepalive_seconds``; run while any is idle."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        oldest = None
        for origin, stack in list(self._idle.items()):
            for conn in stack:
                if conn.closed or now - conn.last >= self._keepalive:
                    conn.close()
                elif oldest is None or conn.last < oldest.last:
                    oldest = conn
            stack[:] = [conn for conn in stack if not conn.closed]
            if not stack:
                del self._idle[origin]
        if oldest is not None:
            self._sweep = asyncio.get_running_loop().call_at(
                oldest.last + self._keepalive, self._expire
            )

    def _target(self, endpoint: str, url: str | URL) -> tuple[_Origin, str]:
        """The origin of ``url`` and its request line and Host header after the method.
        Raises UpstreamError for a URL that is not http(s)."""
        text = str(url)
        try:
            parts = urlsplit(text)
            scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
            if scheme not in ("http", "https") or not host:
                raise ValueError(f"not an http(s) URL: {text[:60]!r}")
            host = host if host.isascii() else host.encode("idna").decode("ascii")
        except (ValueError, UnicodeError) as exc:
            raise transport_error(endpoint, exc) from None
        default = 443 if scheme == "https" else 80
        where = f"[{host}]" if ":" in host else host
        if port is not None and port != default:
            where = f"{where}:{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if _TARGET_OK.fullmatch(path) is None:  # a space, a non-ASCII letter: percent-encoded
            path = quote(path, safe=_TARGET_SAFE)
        if len(self._targets) >= _TARGETS_MAX:
            self._targets.clear()
        found = self._targets[url] = (
            (scheme, host, port or default),
            f"{path} HTTP/1.1\r\nHost: {where}\r\n",
        )
        return found


def _request(start: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """The request's bytes: ``start`` (request line and Host), the caller's headers as given,
    what aiohttp added unless the caller set it, Content-Length, the body. Raises ValueError
    for a header holding a line break (it would smuggle a header)."""
    given = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if given.count("\n") != len(headers) or given.count("\r") != len(headers):
        raise ValueError("a line break in a header name or value")
    names = "\n" + given.lower()
    if "\nhost:" in names:
        start = start[: start.index("\r\n") + 2]
    extra = "".join([line for name, line in _DEFAULTS if name not in names])
    if body is None:
        return f"{start}{given}{extra}\r\n".encode()
    if "\ncontent-type:" not in names:
        extra += "Content-Type: application/octet-stream\r\n"
    if "\ncontent-length:" not in names:
        extra += f"Content-Length: {len(body)}\r\n"
    return f"{start}{given}{extra}\r\n".encode() + body
