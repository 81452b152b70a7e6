"""Plain ASGI helpers: one request's body, headers and answer, without a framework."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from schemas import RequestTooLargeError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")
_DRAIN_LIMIT = 256 * 1024 * 1024


class HttpRequest:
    """One HTTP exchange: the scope, lazily decoded headers, and whether the answer started."""

    __slots__ = ("_headers", "receive", "scope", "send", "started")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.started = False
        self._headers: dict[str, str] | None = None

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    def header(self, name: str) -> str | None:
        """A request header by lower-case name (the last one wins)."""
        if self._headers is None:
            self._headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                             for k, v in self.scope["headers"]}
        return self._headers.get(name)

    def client_host(self) -> str:
        client = self.scope.get("client")
        return str(client[0]) if client else ""

    async def body(self, limit: int) -> bytes:
        """The whole body. Raises RequestTooLargeError past ``limit`` bytes."""
        declared = self.header("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._drain(0)
            raise RequestTooLargeError(f"request body is over the {limit}-byte limit")
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                break
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                if msg.get("more_body", False):
                    await self._drain(size)
                raise RequestTooLargeError(f"request body is over the {limit}-byte limit")
            parts.append(chunk)
            if not msg.get("more_body", False):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _drain(self, size: int) -> None:
        # A client still uploading cannot read our 413 if the connection closes under it;
        # read and discard the rest (bounded) so the answer reaches it.
        while size < _DRAIN_LIMIT:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if not msg.get("more_body", False):
                return

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers."""
        self.started = True
        await self.send({"type": "http.response.start", "status": status,
                         "headers": list(headers)})

    async def chunk(self, data: bytes, *, more: bool = True) -> None:
        """Send part of the body (``more=False`` ends it)."""
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, body: bytes, headers: Headers | None = None) -> None:
        """A whole answer in one go."""
        await self.start(
            status,
            [JSON_TYPE, (b"content-length", str(len(body)).encode()), *(headers or ())],
        )
        await self.chunk(body, more=False)
