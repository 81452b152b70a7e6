"""The HTTP servers that can run the ingress's ASGI app (``server.engine``).

The app (``gateway.ingress.app.create_app``) is a plain ASGI app; this module owns how a
listening socket becomes a server for it:

- ``builtin`` (the default): the gateway's own HTTP/1.1 server on this event loop
  (``gateway.process.h1``, with llhttp via ``httptools`` as its parser): the same refusals as
  Hypercorn's edge, in the caller's API shape; HTTP/2 (prior knowledge) handed to Hypercorn's
  protocol.
- ``hypercorn``: HTTP/1.1 and h2c, with the connection-layer defences of
  ``gateway.ingress.http_edge`` installed under it.
- ``granian`` (the optional extra ``granian``): a Rust server (hyper) run embedded in this
  event loop. Its parser refuses a ``Content-Length`` list, an obs-fold, garbage and an
  unknown HTTP version (bodiless 400), reads a request with both ``Content-Length`` and
  ``Transfer-Encoding`` as chunked and closes its connection; :func:`edge_guard` adds the
  check the ASGI layer can still make (the method's case). What neither can do (a bare LF
  refused, a stalled head answered 408, refusals in the API shape) is listed in the README.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

from gateway.http import busy_poll
from gateway.ingress.edge_refusals import HEADER_TIMEOUT, refusal_answer
from gateway.process.h1.server import serve as serve_builtin

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, MutableMapping

    from schemas.config import ServerConfig

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    ASGIApp = Callable[
        [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
        Awaitable[None],
    ]

logger = logging.getLogger(__name__)

ENGINES = ("hypercorn", "granian", "builtin")
_BACKLOG = 1024
_MISSING_GRANIAN = "server.engine granian needs the granian extra: pip install 'llmgw[granian]'"


class EngineUnavailableError(Exception):
    """The configured engine is not installed (the message says which extra to install)."""


def check_engine(engine: str) -> None:
    """Raise EngineUnavailableError when ``engine`` cannot run here (its extra is missing)."""
    if engine == "granian":
        try:
            import granian  # noqa: F401
        except ImportError:
            raise EngineUnavailableError(_MISSING_GRANIAN) from None


async def serve_http(
    engine: str,
    app: ASGIApp,
    sock: socket.socket,
    server: ServerConfig,
    shutdown: asyncio.Event,
) -> None:
    """Serve ``app`` on the listening ``sock`` (this call owns and closes it) with ``engine``
    until ``shutdown`` is set, busy polling after each write if ``server.busy_poll_us`` says
    so. Raises EngineUnavailableError, and what the server raises."""
    if engine == "granian" and server.busy_poll_us:
        # Granian's threads need the GIL to hand each request to the loop, and a polling
        # loop holds it: measured, 300 µs saved nothing and 1,000 µs took p50 at
        # concurrency 1 from 1.1 to 1.5 ms (README, "Busy polling").
        logger.warning(
            "server.busy_poll_us with server.engine granian slows answers (the polling loop "
            "holds the GIL granian's threads need); use it with builtin or hypercorn"
        )
    poller = busy_poll.install(asyncio.get_running_loop(), server.busy_poll_us)
    try:
        await _serve(
            engine, app if poller is None else polling(app, poller), sock, server, shutdown
        )
    finally:
        busy_poll.uninstall(poller)


async def _serve(
    engine: str,
    app: ASGIApp,
    sock: socket.socket,
    server: ServerConfig,
    shutdown: asyncio.Event,
) -> None:
    if engine == "granian":
        await _serve_granian(app, sock, server, shutdown)
        return
    if engine == "builtin":
        await serve_builtin(
            app,
            without_nagle(sock),
            header_timeout=server.header_timeout_seconds,
            shutdown=shutdown,
        )
        return
    await _serve_hypercorn(app, sock, server, shutdown)


async def serve_local(app: ASGIApp, sock: socket.socket, stop: asyncio.Event) -> None:
    """Serve ``app`` on a Unix socket (the local admin socket) with the builtin server until
    ``stop`` is set: a head not all sent within :data:`HEADER_TIMEOUT` is answered 408, and
    answers under way are given 2 s at the stop."""
    await serve_builtin(app, sock, header_timeout=HEADER_TIMEOUT, shutdown=stop, grace=2.0)


async def hypercorn_serve(app: ASGIApp, config: Any, shutdown_trigger: Any) -> None:
    """Hypercorn's ``serve``, imported only when the ``hypercorn`` engine runs (the others
    start with 70 ms less CPU without it)."""
    from hypercorn.asyncio import serve

    await serve(app, config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]


async def _serve_hypercorn(
    app: ASGIApp, sock: socket.socket, server: ServerConfig, shutdown: asyncio.Event
) -> None:
    from gateway.ingress import http_edge  # installs itself under Hypercorn: only for it

    hconf = http_edge.EdgeConfig()
    hconf.header_timeout = server.header_timeout_seconds
    # Hypercorn owns the listening socket from here and closes it at shutdown; closing it
    # elsewhere too would close a reused descriptor (EBADF at best).
    hconf.bind = [f"fd://{sock.detach()}"]
    hconf.accesslog = None
    hconf.errorlog = logging.getLogger("hypercorn.error")
    hconf.keep_alive_timeout = 75
    hconf.graceful_timeout = 10
    http_edge.install()
    try:
        await hypercorn_serve(app, hconf, shutdown_trigger=shutdown.wait)
    finally:
        hconf.stamped.stop()


async def _serve_granian(
    app: ASGIApp, sock: socket.socket, server: ServerConfig, shutdown: asyncio.Event
) -> None:
    try:
        from granian._granian import SocketHolder
        from granian.constants import Interfaces
        from granian.http import HTTP1Settings
        from granian.server.embed import Server
    except ImportError:
        raise EngineUnavailableError(_MISSING_GRANIAN) from None

    host, port = sock.getsockname()[:2]
    fd = without_nagle(sock).detach()

    class _OnSocket(Server):
        # Serve the socket bound upfront (port 0 is known, SO_REUSEPORT set by the caller)
        # instead of binding a new one.
        def _init_shared_socket(self) -> None:
            self._ssp = None
            # The stub lacks the constructor's arguments (fd, is_uds, backlog).
            self._shd = SocketHolder(fd, False, _BACKLOG)  # type: ignore[call-arg,assignment]
            self._sfd = fd  # type: ignore[assignment]

    runner = _OnSocket(
        edge_guard(app),
        address=str(host),
        port=int(port),
        interface=Interfaces.ASGI,  # with the lifespan protocol, as under Hypercorn
        websockets=False,
        log_enabled=False,
        http1_settings=HTTP1Settings(header_read_timeout=int(server.header_timeout_seconds * 1000)),
    )
    stopper = _stop_on(shutdown, runner)
    try:
        await runner.serve()
    finally:
        stopper.cancel()


def polling(app: ASGIApp, poller: busy_poll.BusyPoll) -> ASGIApp:
    """``app`` holding ``poller``'s window after each part of an answer it sends: the client's
    next request (or its stream's next read) may come before an idle core would wake."""

    async def polled(scope: Scope, receive: Any, send: Any) -> None:
        async def sent(message: Message) -> None:
            await send(message)
            poller.hold()

        await app(scope, receive, sent)

    return polled


def without_nagle(sock: socket.socket) -> socket.socket:
    """``sock`` (a listening TCP socket) with TCP_NODELAY, which the connections it accepts
    inherit (Linux). asyncio sets it on each connection Hypercorn accepts; granian (tokio) does
    not, and a streamed answer's small writes then wait on the client's delayed ACK: about
    40 ms per stream at concurrency 1."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _stop_on(shutdown: asyncio.Event, runner: Any) -> asyncio.Task[None]:
    async def wait() -> None:
        await shutdown.wait()
        runner.stop()

    return asyncio.get_running_loop().create_task(wait(), name="llmgw:granian-stop")


def edge_guard(app: ASGIApp) -> ASGIApp:
    """``app`` behind the framing check the ASGI layer can still make under granian: a
    method not in upper case (hyper passes it on; methods are case-sensitive) is answered 400
    in the caller's API shape and the connection closed, before the app runs."""

    async def guarded(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not str(scope["method"]).isupper():
            method = str(scope["method"])[:32]
            reason = f"the method {method!r} is not served: methods are upper-case"
            await _refuse(scope, send, reason)
            return
        await app(scope, receive, send)

    return guarded


async def _refuse(scope: Scope, send: Any, message: str) -> None:
    target = scope.get("raw_path") or str(scope.get("path", "")).encode()
    headers, body = refusal_answer(400, message, "invalid_request", bytes(target))
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def run_loop(main: Coroutine[Any, Any, int], loop: str) -> int:
    """Run ``main`` on uvloop (measured faster: tests/benchmarks/) or asyncio's own loop."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
