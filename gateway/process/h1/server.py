"""The builtin engine's server: a listening socket's connections served on this event loop,
the ASGI lifespan around them, and the clock they share.

:func:`serve` owns the server and its :class:`ServerState`: the app's lifespan (startup
before the first connection is accepted, shutdown after the last answer), a tick each second
that stamps the ``date`` header every answer carries and closes connections idle past the
keep-alive timeout, and the graceful stop (no new connections, idle ones closed at once,
answers under way given :data:`GRACE_SECONDS` or the grace asked, then every connection
closed). Connections that open with HTTP/2's preface are served by its :class:`H2Handoff`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any
from wsgiref.handlers import format_date_time

from gateway.http.lifespan import Lifespan
from gateway.process.h1.connection import Connection

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable, MutableMapping

    from gateway.process.h1.h2_handoff import H2Handoff

    Message = MutableMapping[str, Any]
    ASGIApp = Callable[..., Awaitable[None]]

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 75.0  # as Hypercorn's is set for the gateway
GRACE_SECONDS = 10.0  # as Hypercorn's graceful_timeout for the gateway
_CALLS_END_SECONDS = 2.0  # the most a stop waits for the app's calls to end, then cancelled
_BACKLOG = 1024


class ServerState:
    """What every connection of one server shares."""

    __slots__ = (
        "app",
        "connections",
        "date_header",
        "emptied",
        "grace",
        "h2",
        "header_timeout",
        "keep_alive_timeout",
        "loop",
        "serving",
        "stopping",
    )

    def __init__(
        self,
        app: ASGIApp,
        loop: asyncio.AbstractEventLoop,
        *,
        header_timeout: float,
        keep_alive_timeout: float = KEEP_ALIVE_SECONDS,
        grace: float | None = None,
    ) -> None:
        self.app = app
        # What answers under way are given at a stop (GRACE_SECONDS, read when it is made).
        self.grace = GRACE_SECONDS if grace is None else grace
        self.loop = loop
        self.header_timeout = header_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.connections: set[Connection] = set()
        self.serving: set[asyncio.Task[None]] = set()  # the app's calls under way
        self.stopping = False
        self.emptied = asyncio.Event()  # set once stopping and no connection is left
        # Serves the connections that speak HTTP/2: made (Hypercorn imported) for the first.
        self.h2: H2Handoff | None = None
        self.date_header = b""
        self.tick()

    def handoff(self) -> H2Handoff:
        """What serves a connection that speaks HTTP/2 (made at the first one)."""
        if self.h2 is None:
            from gateway.process.h1.h2_handoff import H2Handoff  # Hypercorn: only for h2

            self.h2 = H2Handoff(
                self.app,
                self.loop,
                keep_alive_timeout=self.keep_alive_timeout,
                graceful_timeout=self.grace,
            )
        return self.h2

    def forget(self, conn: Connection) -> None:
        """``conn`` has ended."""
        self.connections.discard(conn)
        if self.stopping and not self.connections:
            self.emptied.set()

    def tick(self) -> None:
        """Stamp the date header anew and close the connections idle too long."""
        self.date_header = b"date: " + format_date_time(time.time()).encode("ascii") + b"\r\n"
        limit = self.loop.time() - self.keep_alive_timeout
        for conn in list(self.connections):
            if conn.idle_since is not None and conn.idle_since < limit:
                conn.close_if_idle()


async def serve(
    app: ASGIApp,
    sock: socket.socket,
    *,
    header_timeout: float,
    shutdown: asyncio.Event,
    keep_alive_timeout: float = KEEP_ALIVE_SECONDS,
    grace: float | None = None,
) -> None:
    """Serve ``app`` on the listening ``sock`` (TCP or a Unix socket; this call owns and
    closes it) until ``shutdown`` is set, giving answers under way ``grace`` seconds then
    (default :data:`GRACE_SECONDS`).
    Raises gateway.http.lifespan.LifespanError if the app fails its startup."""
    loop = asyncio.get_running_loop()
    state = ServerState(
        app,
        loop,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
        grace=grace,
    )
    lifespan = Lifespan(app)
    await lifespan.startup()
    ticker = _Ticker(state)
    try:
        server = await loop.create_server(lambda: Connection(state), sock=sock, backlog=_BACKLOG)
        try:
            await shutdown.wait()
        finally:
            server.close()
            await _drain(state)
            await server.wait_closed()
    finally:
        ticker.stop()
        await lifespan.shutdown()


async def _drain(state: ServerState) -> None:
    """Close idle connections now and the rest once their answers are out, or after the
    grace; the HTTP/2 connections alike, at the same time."""
    state.stopping = True
    if state.h2 is None:
        await _drain_http1(state)
    else:
        await asyncio.gather(_drain_http1(state), state.h2.stop(state.grace))


async def _drain_http1(state: ServerState) -> None:
    for conn in list(state.connections):
        conn.close_if_idle()  # one under way closes when its answer is out
    if state.connections:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(state.grace):
                await state.emptied.wait()
    if state.connections:
        # Said, or a stop that cut streams looks like one that drained them.
        logger.warning(
            "stopping: %d connection(s) still answering after the %g s grace closed (their "
            "answers are cut short)",
            len(state.connections),
            state.grace,
        )
    for conn in list(state.connections):
        conn.close()
    # The app's calls still under way (settling an answer written, or hearing that their
    # connection closed) are awaited before the lifespan stops the request log's outbox:
    # they went on past the stop, and their rows reached a closed outbox. One that does not
    # end in time (it listens to no disconnect) is cancelled.
    if state.serving:
        _, late = await asyncio.wait(list(state.serving), timeout=_CALLS_END_SECONDS)
        for call in late:
            call.cancel()
        if late:
            await asyncio.wait(late, timeout=_CALLS_END_SECONDS)


class _Ticker:
    """Calls ``state.tick`` at the turn of each second until stopped."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._handle = self._next()

    def _next(self) -> asyncio.TimerHandle:
        now = time.time()
        return self._state.loop.call_later(int(now) + 1 - now, self._fire)

    def _fire(self) -> None:
        self._state.tick()
        self._handle = self._next()

    def stop(self) -> None:
        self._handle.cancel()


__all__ = ["GRACE_SECONDS", "KEEP_ALIVE_SECONDS", "ServerState", "serve"]
