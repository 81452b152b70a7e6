"""How a gateway process knows its HTTP side has started, and why it did not.

``gateway.process.serve`` starts the HTTP server as a task and waits here until the gateway
answers ``GET /health`` (so the ready line is true), racing what can end a start early: the
server's task failing (its app's start-up subscribes on the bus), the ingress operations'
task failing (they subscribe too), and SIGINT/SIGTERM. A bus that drops in that window makes
those subscriptions fail after their confirmation timeout; :func:`lost_bus` tells such a
failure from a bug, so the process can say it in one line and exit (a worker of ``llmgw serve
--workers`` is then started again by its supervisor, once the bus is back).

Each probe of ``/health`` is bounded: a server that never accepts (its start-up still waiting
on the bus) leaves a connection in the listening socket's backlog, and an unbounded read of
its answer waited forever, SIGTERM included.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from bus import BusClosedError

if TYPE_CHECKING:
    from bus import Bus

_READY_ATTEMPTS = 200
_ATTEMPT_TIMEOUT_S = 2.0  # one /health probe: its mode request alone may take 1 s
_RETRY_S = 0.01


async def until_started(
    host: str,
    port: int,
    server: asyncio.Task[None],
    ops: asyncio.Task[None] | None,
    shutdown: asyncio.Event,
) -> bool:
    """True once ``GET /health`` answers on ``host:port``; False when ``shutdown`` was set
    first (the server is then stopped). Raises what ended the ``server`` or ``ops`` task first
    (the server is then stopped), RuntimeError when the gateway never answers."""
    answering = asyncio.create_task(_until_answering(host, port))
    stopped = asyncio.create_task(shutdown.wait())
    ending: set[asyncio.Future[object]] = {answering, stopped, server}  # type: ignore[arg-type]
    if ops is not None:
        ending.add(ops)  # type: ignore[arg-type]
    try:
        await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (answering, stopped):
            task.cancel()
    if shutdown.is_set():
        await _stop(server)
        return False
    failed = next((t for t in (server, ops) if t is not None and t.done()), None)
    if failed is None:
        answering.result()  # raises RuntimeError when it gave up
        return True
    await _stop(server)
    if not failed.cancelled() and (why := failed.exception()) is not None:
        raise why
    raise RuntimeError("the HTTP server stopped during startup")


async def _stop(server: asyncio.Task[None]) -> None:
    # Cancelled, not asked: its app's start-up may still be waiting on the bus.
    server.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await server


async def _until_answering(host: str, port: int) -> None:
    """Return once ``GET /health`` answers 200. Raises RuntimeError after every attempt."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    for _ in range(_READY_ATTEMPTS):
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(_ATTEMPT_TIMEOUT_S):
                if await _health(target, port):
                    return
        await asyncio.sleep(_RETRY_S)
    raise RuntimeError("the gateway did not answer /health during startup")


async def _health(host: str, port: int) -> bool:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nhost: llmgw\r\nconnection: close\r\n\r\n")
        await writer.drain()
        status = await reader.readline()
    finally:
        writer.close()
    return status.startswith(b"HTTP/1.1 200")


def lost_bus(exc: BaseException, bus: Bus) -> str | None:
    """Why ``exc``, raised while a process started, is the bus's failure: the message of the
    BusClosedError it carries (as its cause, its context or in its group); else, while the bus
    is disconnected, ``exc`` itself. None for anything else."""
    found = _bus_closed(exc, set())
    if found is not None:
        return found.message
    if not bus.connected:
        return repr(exc)
    return None


def _bus_closed(exc: BaseException | None, seen: set[int]) -> BusClosedError | None:
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, BusClosedError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                found = _bus_closed(inner, seen)
                if found is not None:
                    return found
        exc = exc.__cause__ or exc.__context__
    return None
