"""Plain ASGI helpers: one request's body, headers and answer, without a framework."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import Any, cast
from urllib.parse import unquote_to_bytes

from gateway.http.body_encoding import decoded
from gateway.http.deadline import Resumed, deadline
from schemas import (
    BodyTimeoutError,
    ClientClosedError,
    InvalidRequestError,
    RequestTooLargeError,
    RouteNotFoundError,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")
_CONNECTION_CLOSE = (b"connection", b"close")
BODY_TIMEOUT = 30.0  # seconds, the default of ``server.body_timeout_seconds``
_DRAIN_LIMIT = 256 * 1024 * 1024

MAX_STORED_CHARS = 256
"""The most of a client-chosen string (the model name asked for) that is stored or echoed."""


def _segment(raw: bytes) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8") if b"%" in raw else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError("the path is not percent-encoded UTF-8") from None


def bounded(text: str) -> str:
    """``text``, or its first :data:`MAX_STORED_CHARS` characters ending in ``…`` when it is
    longer: what a client sends must not grow the request log by what it likes."""
    if len(text) <= MAX_STORED_CHARS:
        return text
    return text[: MAX_STORED_CHARS - 1] + "…"


def request_ids() -> Iterator[str]:
    """The ids a maker gives the exchanges it answers (their ``x-request-id``), one per
    ``next()``: ``<pid, hex>-<8 random hex digits>-<count>``, none repeated in its process."""
    # The pid says which process answered; the random part keeps ids apart where pids repeat
    # (ingresses in containers are all pid 1) and between the makers of one process (the
    # ingress, the local admin socket): the limits' owner keys leases and settles by request
    # id, and a shared one leaked a concurrency slot. All C: no Python frame per request.
    prefix = f"{os.getpid():x}-{secrets.token_hex(4)}-"
    return map(f"{prefix}{{}}".format, itertools.count(1))


# What an answer does to its connection once sent: keep it alive, close it, or first read
# and discard the rest of a body the client is still sending (see HttpRequest._drain).
_KEEP, _CLOSE, _LINGER = 0, 1, 2


def header_text(value: str) -> str:
    """A header's ``value`` (as :attr:`HttpRequest.headers` holds it: its bytes read as
    latin-1, HTTP's own reading) read as the UTF-8 text a client sends a name in; as it is
    when it is not UTF-8."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return value


def _one_credential(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Raise InvalidRequestError when ``headers`` hold ``authorization`` or ``x-api-key``
    more than once."""
    names = [name.lower() for name, _ in headers]
    for name in (b"authorization", b"x-api-key"):
        if names.count(name) > 1:
            raise InvalidRequestError(
                f"the request has more than one {name.decode()} header: send one key"
            )


class HttpRequest:
    """One HTTP exchange: the scope, its headers decoded (``headers``: lower-case name ->
    value, the last one wins), whether the answer started, and the id the gateway gave the
    exchange (its answers' ``x-request-id``; "" until given). ``body_timeout`` bounds the wait
    for the request body (seconds)."""

    __slots__ = (
        "_after",
        "_body_read",
        "_repeated",
        "body_timeout",
        "extra_headers",
        "headers",
        "receive",
        "request_id",
        "scope",
        "send",
        "started",
    )

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body_timeout: float = BODY_TIMEOUT,
        *,
        request_id: str = "",
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.body_timeout = body_timeout
        self.started = False
        self.request_id = request_id
        self.extra_headers: list[tuple[bytes, bytes]] = []
        """Headers every answer to this exchange carries (a limited key's rate headers)."""
        # Decoded at once: every request the gateway serves reads one (its key, at least).
        raw = scope.get("headers", ())
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw
        }
        self._repeated = len(self.headers) < len(raw)  # some header came more than once
        self._after = _KEEP
        self._body_read = False

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    def segments(self) -> list[str]:
        """The path's segments after its leading ``/``: the raw path (ASGI ``raw_path``, else
        ``path``) split on ``/`` first, then each segment percent-decoded once, so ``%2F``
        stays a ``/`` inside its segment. Raises InvalidRequestError for a segment that
        is not UTF-8 or holds a NUL."""
        raw = self.scope.get("raw_path")
        if raw is None:  # the server gives only the decoded path
            parts = self.path.split("/")
        else:
            parts = [_segment(part) for part in bytes(raw).split(b"/")]
        if any("\x00" in part for part in parts):
            raise InvalidRequestError("the path holds a NUL (%00)")
        return parts[1:]

    def segments_after(self, prefix: str) -> list[str]:
        """The path's segments after those of ``prefix`` (``/admin/keys/``), as
        :meth:`segments` decodes them. Raises RouteNotFoundError when the path does not begin
        with ``prefix``'s segments (``/admin/keys%2Fid``), InvalidRequestError for a path that
        does not decode."""
        head = prefix.strip("/").split("/")
        parts = self.segments()
        if parts[: len(head)] != head:
            raise RouteNotFoundError(f"no such path {self.split_path()}")
        return parts[len(head) :]

    def split_path(self) -> str:
        """The path as :meth:`segments` splits it, a ``/`` inside a segment shown as ``%2F``
        (what admin routes match and their errors name). Raises InvalidRequestError."""
        return "/" + "/".join(part.replace("/", "%2F") for part in self.segments())

    def header(self, name: str) -> str | None:
        """A request header by lower-case name (the last one wins)."""
        return self.headers.get(name)

    def bearer_token(self) -> str | None:
        """The credential presented: ``Authorization: Bearer <token>``, else ``x-api-key``,
        else None. Raises InvalidRequestError when either header came more than once: which
        one a proxy in front checked is unknown, so neither is taken."""
        if self._repeated:
            _one_credential(self.scope["headers"])
        auth = self.header("authorization")
        if auth and auth[:7].lower() == "bearer ":
            return auth[7:].strip() or None
        return self.header("x-api-key") or None

    def client_host(self) -> str:
        client = self.scope.get("client")
        return str(client[0]) if client else ""

    async def body(self, limit: int) -> bytes:
        """The whole body, decoded when the client sent it gzipped or deflated (raising as
        ``body_encoding.decoded`` does). Raises RequestTooLargeError past ``limit`` bytes (at
        once when the declared Content-Length is over it), BodyTimeoutError when it has not
        all arrived within ``body_timeout`` seconds and ClientClosedError when the client
        went away before it ended; the answer to any of those closes the connection."""
        declared = self.header("content-length")
        expected = int(declared) if declared is not None and declared.isdigit() else None
        if expected is not None and expected > limit:
            self._after = _LINGER
            raise RequestTooLargeError(f"request body is over the {limit}-byte limit")
        reading = self._read(limit, expected)
        try:
            # Nearly every body is there with the request: read without arming a timer, and
            # only a body still arriving waits under the deadline.
            first = reading.send(None)
        except StopIteration as done:
            return cast("bytes", done.value)
        try:
            with deadline(self.body_timeout):
                return await Resumed(reading, first)
        except TimeoutError:
            self._after = _CLOSE
            raise BodyTimeoutError(
                f"the request body did not arrive within {self.body_timeout:g} seconds"
            ) from None

    async def _read(self, limit: int, expected: int | None) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                # The client went away with its body unfinished: what arrived may still parse
                # (a whole JSON chunk before a broken one), but it is not the request.
                self._after = _CLOSE
                raise ClientClosedError("the client went away before its request body ended")
            chunk = msg.get("body", b"")
            size += len(chunk)
            more = msg.get("more_body", False)
            if size > limit:
                if more:
                    self._after = _LINGER
                raise RequestTooLargeError(f"request body is over the {limit}-byte limit")
            parts.append(chunk)
            # All the declared bytes are here: done, without waiting for the empty message
            # granian and Hypercorn end a body with (under granian a round trip between its
            # threads and this loop; the server has read the body whole either way).
            if not more or size == expected:
                break
        self._body_read = True
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        if (encoding := self.headers.get("content-encoding")) is not None:
            return decoded(body, encoding, limit)
        return body

    def _body_unread(self) -> bool:
        """Whether the client sends a body this exchange has not read."""
        if self._body_read:
            return False
        declared = self.header("content-length")
        if declared is not None:
            return declared != "0"
        return self.header("transfer-encoding") is not None

    async def _drain(self) -> None:
        # A client still uploading may read our answer only once it has sent its body, and a
        # connection closed under unread data is reset, losing the answer: read and discard
        # the rest (bounded in bytes and in time) before the connection closes.
        size = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.body_timeout):
                while size < _DRAIN_LIMIT:
                    msg = await self.receive()
                    if msg["type"] == "http.disconnect":
                        return
                    size += len(msg.get("body", b""))
                    if not msg.get("more_body", False):
                        return

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers, the exchange's ``x-request-id`` among them (every
        answer names its exchange, so that a caller can find it in the logs and events)."""
        self.started = True
        head = list(headers)
        if self.request_id:
            head.append((b"x-request-id", self.request_id.encode()))
        if self.extra_headers:
            head += self.extra_headers
        await self.send({"type": "http.response.start", "status": status, "headers": head})

    async def chunk(self, data: bytes, *, more: bool = True) -> None:
        """Send part of the body (``more=False`` ends it)."""
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, body: bytes, headers: Headers | None = None) -> None:
        """A whole answer in one go. After a body refused or left unread, the answer closes
        the connection, sent in full before the rest of the body is drained."""
        head = [JSON_TYPE, (b"content-length", str(len(body)).encode()), *(headers or ())]
        if self._after == _KEEP and self._body_unread():
            # Answered before its body was read (an unknown path, a refused key): the server
            # closes such a connection once the answer is out, so the answer says it will,
            # or the client would send its next request on a connection being closed.
            self._after = _LINGER
        if self._after == _KEEP:
            await self.start(status, head)
            await self.chunk(body, more=False)
            return
        await self.start(status, [*head, _CONNECTION_CLOSE])
        if self._after == _LINGER:
            await self.chunk(body)
            await self._drain()
            body = b""
        await self.chunk(body, more=False)
