"""The pooled upstream HTTP client every adapter shares: aiohttp, used directly.

Measured before choosing (tests/benchmarks/): on one core the httpx API over aiohttp's engine
cost about 310-340 µs of CPU per upstream request against 110 µs for aiohttp alone; on the
gateway's hot path that difference was a quarter of its CPU. Transport failures come out as
``UpstreamError`` (timeouts as ``UpstreamTimeoutError``), never as aiohttp types.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.streams import EofStream

from schemas import UpstreamError, UpstreamTimeoutError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    from aiohttp import ClientResponse
    from yarl import URL

_READ_CHUNK = 64 * 1024
# Distinct (read, connect) timeout pairs seen; a route's pair is fixed by its config, so a
# handful. Past this many (configs churned by reloads), the memo starts over.
_TIMEOUTS_MAX = 256


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole upstream answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class StreamAnswer:
    """An upstream answer still arriving: status and headers now, the body in pieces."""

    def __init__(self, endpoint: str, resp: aiohttp.ClientResponse) -> None:
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self._endpoint = endpoint
        self._resp = resp

    async def read(self) -> bytes:
        """The rest of the body. Raises UpstreamError."""
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise transport_error(self._endpoint, exc) from None

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises UpstreamError when the connection breaks."""
        return _Pieces(self._endpoint, self._resp.content)


class _Pieces:
    """The pieces of a body as they arrive, as an async iterator. Not an async generator: a
    generator left unfinished (a stream ends at its ``[DONE]``, before the body's end) is
    closed by the event loop's finalizer hook, a task scheduled per stream."""

    __slots__ = ("_content", "_endpoint")

    def __init__(self, endpoint: str, content: aiohttp.StreamReader) -> None:
        self._endpoint = endpoint
        self._content = content

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        try:
            piece = await self._content.readany()
        except EofStream:
            raise StopAsyncIteration from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise transport_error(self._endpoint, exc) from None
        if not piece:  # what ``iter_any`` ends on, as on EofStream
            raise StopAsyncIteration
        return piece


def transport_error(endpoint: str, exc: BaseException) -> UpstreamError:
    """Map an aiohttp failure (timeout, refused, reset) to an UpstreamError."""
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp's timeouts subclass it
        return UpstreamTimeoutError(
            f"upstream did not answer in time ({type(exc).__name__})",
            endpoint=endpoint,
            kind="timeout",
        )
    kind = "connect" if isinstance(exc, aiohttp.ClientConnectorError) else "transport"
    return UpstreamError(
        f"upstream connection failed ({type(exc).__name__})", endpoint=endpoint, kind=kind
    )


class UpstreamHTTP:
    """Owns one pooled aiohttp session, created lazily inside the running event loop."""

    def __init__(self, *, limit: int = 1000, keepalive_seconds: float = 30.0) -> None:
        self._limit = limit
        self._keepalive = keepalive_seconds
        self._session: aiohttp.ClientSession | None = None
        # Building a ClientTimeout (an attrs class) per request cost more than the lookup.
        self._timeouts: dict[tuple[float, float], aiohttp.ClientTimeout] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=self._keepalive)
            # No cookie jar: an upstream's Set-Cookie must never be replayed for other callers.
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=True, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    def _timeout(self, timeout: float, connect_timeout: float) -> aiohttp.ClientTimeout:
        """The (immutable, so shared) ClientTimeout of one (read, connect) pair."""
        found = self._timeouts.get((timeout, connect_timeout))
        if found is None:
            if len(self._timeouts) >= _TIMEOUTS_MAX:
                self._timeouts.clear()
            found = aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout, sock_read=timeout
            )
            self._timeouts[(timeout, connect_timeout)] = found
        return found

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
        try:
            async with self._client().post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self._timeout(timeout, connect_timeout),
            ) as resp:
                return Answer(resp.status, resp.headers, await resp.read())
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise transport_error(endpoint, exc) from None

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
        Raises UpstreamError for transport failures."""
        return _Streaming(
            endpoint,
            functools.partial(
                self._client().post,
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self._timeout(timeout, connect_timeout),
            ),
        )

    async def get_status(self, url: str, *, timeout: float) -> int | None:
        """GET ``url``; its status, or None when it did not answer."""
        try:
            async with self._client().get(
                url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False
            ) as resp:
                return resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None

    async def get(
        self, endpoint: str, url: str, headers: Mapping[str, str], *, timeout: float
    ) -> Answer:
        """GET ``url`` and read the whole answer. Raises UpstreamError for transport
        failures."""
        try:
            async with self._client().get(
                url,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                return Answer(resp.status, resp.headers, await resp.read())
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise transport_error(endpoint, exc) from None

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Streaming:
    """:meth:`UpstreamHTTP.stream`'s context (a class, not ``@asynccontextmanager``: no
    generator per stream). ``post`` sends the request. Raises UpstreamError for transport
    failures on entry."""

    __slots__ = ("_cm", "_endpoint", "_post")

    def __init__(
        self, endpoint: str, post: Callable[[], AbstractAsyncContextManager[ClientResponse]]
    ) -> None:
        self._endpoint = endpoint
        self._post = post
        self._cm: AbstractAsyncContextManager[ClientResponse] | None = None

    async def __aenter__(self) -> StreamAnswer:
        try:
            self._cm = self._post()
            resp = await self._cm.__aenter__()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise transport_error(self._endpoint, exc) from None
        return StreamAnswer(self._endpoint, resp)

    async def __aexit__(self, *exc_info: object) -> None:
        # Releases a fully read connection to the pool; closes a half-read one, so an
        # abandoned stream's upstream sees its client go away.
        if self._cm is not None:
            await self._cm.__aexit__(None, None, None)
