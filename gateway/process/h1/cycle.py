"""One request's exchange on a builtin-engine connection: the ASGI ``receive`` and ``send``
the app is called with.

:class:`Exchange` owns the request's body as it arrives (handed to ``receive`` whole when it
is all there, in parts while it streams), whether the client is gone, and the answer's
framing on the wire: ``Content-Length`` when the app gives one, chunked otherwise, nothing
after a HEAD or a bodiless status. The head is held back until the first body part so that a
whole answer leaves in one write. ``send`` waits while the connection's write buffer is full
(the connection's flow control) and does nothing once the client is gone, as ASGI servers do.
"""

from __future__ import annotations

import http
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections.abc import MutableMapping

    from gateway.process.h1.connection import Connection

    Message = MutableMapping[str, Any]

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("ascii") for s in http.HTTPStatus
}
_BODILESS = frozenset({204, 304})
_LAST_CHUNK = b"0\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_EMPTY: Message = {"type": "http.request", "body": b"", "more_body": False}
_BODY_HIGH_WATER = 256 * 1024  # bytes of request body held before the connection stops reading


class Exchange:
    """The request ``scope`` on ``conn``; ``keep_alive`` says whether the connection may carry
    another request after this one (the client's wish, before the answer's say)."""

    __slots__ = (
        "_body",
        "_body_size",
        "_chunked",
        "_end_given",
        "_expect_continue",
        "_head",
        "_head_only",
        "_waiter",
        "body_complete",
        "conn",
        "disconnected",
        "keep_alive",
        "response_complete",
        "response_started",
        "scope",
    )

    def __init__(
        self,
        conn: Connection,
        scope: dict[str, Any],
        *,
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.body_complete = False
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self._body: list[bytes] = []
        self._body_size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._expect_continue = expect_continue
        self._head_only = scope["method"] == "HEAD"
        self._head = b""
        self._chunked = False
        self._end_given = False

    # -- fed by the connection ------------------------------------------------------------

    def body_received(self, data: bytes) -> None:
        """Part of the request's body arrived."""
        self._body.append(data)
        self._body_size += len(data)
        if self._body_size > _BODY_HIGH_WATER:
            self.conn.pause_reading()
        self._wake()

    def body_ended(self) -> None:
        """The request's body is all here."""
        self.body_complete = True
        self._wake()

    def body_refused(self) -> None:
        """The body broke its framing and the server answers the refusal: what of it is
        held is dropped, then as :meth:`client_gone`."""
        self._body.clear()
        self._body_size = 0
        self.client_gone()

    def client_gone(self) -> None:
        """The connection ended: ``receive`` says ``http.disconnect``, ``send`` does nothing."""
        self.disconnected = True
        self.keep_alive = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- the app's side -------------------------------------------------------------------

    async def receive(self) -> Message:
        """The body so far (``more_body`` until it is all here), then ``http.disconnect``
        once the client is gone or the answer is complete."""
        while True:
            if self._body:
                body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
                self._body.clear()
                if self._body_size > _BODY_HIGH_WATER:
                    self.conn.resume_reading()
                self._body_size = 0
                more = not self.body_complete
                self._end_given = not more
                return {"type": "http.request", "body": body, "more_body": more}
            if self.disconnected or self.response_complete:
                return {"type": "http.disconnect"}
            if self.body_complete and not self._end_given:
                self._end_given = True  # the empty closing message is given once
                return dict(_EMPTY)
            if self._expect_continue and not self.response_started:
                self._expect_continue = False
                self.conn.write(_CONTINUE)
            self._waiter = self.conn.loop.create_future()
            await self._waiter

    async def send(self, message: Message) -> None:
        """Write the app's answer: its head (held until the first body part), its body
        parts, and the end. Raises RuntimeError on a message out of order, ValueError on a
        header that holds CR, LF or NUL (the app then fails and the server answers 500)."""
        if self.disconnected:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.response_started:
                raise RuntimeError("http.response.start sent twice")
            self._head = self._make_head(int(message["status"]), message.get("headers", ()))
            self.response_started = True
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.response_started or self.response_complete:
            raise RuntimeError("http.response.body outside a started answer")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        out = self._head
        self._head = b""
        if self._head_only:
            pass
        elif self._chunked:
            if body:
                out += b"%x\r\n%b\r\n" % (len(body), body)
            if not more:
                out += _LAST_CHUNK
        else:
            out += body
        if out:
            self.conn.write(out)
        if not more:
            self.response_complete = True
            self._wake()
            self.conn.exchange_done(self)
        elif self.conn.writing_paused:
            await self.conn.drained()

    def _make_head(self, status: int, headers: Any) -> bytes:
        if self.conn.state.stopping:
            self.keep_alive = False  # the server closes each connection after its answer
        lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode("ascii")]
        framed = said_connection = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                framed = True
            elif lower == b"connection":
                said_connection = True
                if value.lower() == b"close":
                    self.keep_alive = False
            elif lower == b"transfer-encoding":
                continue  # the framing is the server's to choose
            lines.append(b"%b: %b\r\n" % (name, value))
        if status in _BODILESS or status < 200:
            self._head_only = True
        elif not framed and not self._head_only:
            if self.scope["http_version"] == "1.0":
                self.keep_alive = False  # no chunked coding in HTTP/1.0: the close ends it
            else:
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and not said_connection:
            lines.append(b"connection: close\r\n")
        lines.append(self.conn.state.date_header)
        head = b"".join(lines)
        # Each line ends in the one CRLF put there: a CR, LF or NUL inside a name or value
        # would end the head early and let what follows be read as headers or an answer.
        if head.count(b"\n") != len(lines) or head.count(b"\r") != len(lines) or b"\0" in head:
            raise ValueError("a response header holds CR, LF or NUL")
        return head + b"\r\n"


__all__ = ["Exchange"]
