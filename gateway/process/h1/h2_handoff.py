"""HTTP/2 on the builtin engine: a connection that opens with HTTP/2's preface (h2c, prior
knowledge, ``gateway.process.h1.connection.PREFACE``) is handed to Hypercorn's HTTP/2 protocol
on this event loop, imported with this module when the first such connection comes.

The builtin server speaks HTTP/1.1 itself, where its speed matters. HTTP/2 needs stream
multiplexing, flow control, HPACK and its own defences (stream limits, resets, settings), all
of which Hypercorn (with the ``h2`` library) already has, and the ``hypercorn`` engine serves
them: so such a connection is served exactly as under that engine (its connection and HTTP/2
protocol as ``gateway.ingress.http_edge`` installs them), with the same app.

:class:`H2Handoff` owns the connections handed to it (one task each) and their stop: new
streams are refused and idle connections close at once, streams under way get the grace
period, then what is left is cancelled. Upgrading an HTTP/1.1 request (``Upgrade: h2c``) is
not offered: that request is answered in HTTP/1.1 (``gateway.process.h1.connection``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config as HypercornConfig

from gateway.ingress import http_edge

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    ASGIApp = Callable[..., Awaitable[None]]

__all__ = ["H2Handoff"]

_READ_LIMIT = 64 * 1024


class H2Handoff:
    """Serves the HTTP/2 connections a builtin server hands over, until :meth:`stop`."""

    def __init__(
        self,
        app: ASGIApp,
        loop: asyncio.AbstractEventLoop,
        *,
        keep_alive_timeout: float,
        graceful_timeout: float,
    ) -> None:
        http_edge.install()
        config = HypercornConfig()
        config.keep_alive_timeout = keep_alive_timeout
        config.graceful_timeout = graceful_timeout
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.include_server_header = False  # as the builtin server's HTTP/1.1 answers
        self._config = config
        self._app = ASGIWrapper(app)
        self._loop = loop
        self._context = WorkerContext(None)
        self._lifespan_state: dict[str, Any] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def take(self, transport: asyncio.Transport, data: bytes) -> None:
        """Serve ``transport`` as HTTP/2 from now on; ``data`` is what arrived on it so far
        (the preface first). The caller's protocol must not touch it again."""
        loop = self._loop
        reader = asyncio.StreamReader(limit=_READ_LIMIT, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        reader.feed_data(data)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        server = http_edge.EdgeTCPServer(
            self._app,
            loop,
            self._config,
            self._context,
            self._lifespan_state,
            reader,
            writer,
        )
        task = loop.create_task(server.run(), name="llmgw:h2-connection")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self, grace: float) -> None:
        """Refuse new streams, close idle connections now, give the streams under way
        ``grace`` seconds, then cancel what is left."""
        await self._context.terminated.set()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace)
        left = list(self.tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
