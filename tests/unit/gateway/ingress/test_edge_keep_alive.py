"""The edge's keep-alive wait (EdgeTCPServer): an idle connection closes once its keep-alive
time has passed, or as soon as the server shuts down, as under Hypercorn alone; each wait is
one task, where Hypercorn's ``asyncio.wait_for`` adds a second task and a timer per answer."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

from hypercorn.asyncio import serve

from gateway.ingress import http_edge

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_REQUEST = b"GET / HTTP/1.1\r\nhost: edge\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    head = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def _served(keep_alive: float, shutdown: asyncio.Event) -> AsyncIterator[int]:
    """Hypercorn with the edge installed, on a free loopback port (yielded) until the end of
    the block or ``shutdown``."""
    http_edge.install()
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = http_edge.EdgeConfig()
    config.bind = [f"fd://{sock.detach()}"]
    config.keep_alive_timeout = keep_alive
    config.accesslog = None
    server = asyncio.create_task(serve(_app, config, shutdown_trigger=shutdown.wait))  # type: ignore[arg-type]
    try:
        yield port
    finally:
        shutdown.set()
        await server
        config.stamped.stop()


async def _answered(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has had one answer, now idle (the socket listens from the start:
    the kernel queues it until the server accepts)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_REQUEST)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    return reader, writer


async def test_an_idle_connection_closes_once_its_keep_alive_time_has_passed() -> None:
    loop = asyncio.get_running_loop()
    async with _served(0.2, asyncio.Event()) as port:
        reader, writer = await _answered(port)
        idle_since = loop.time()
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server
        assert loop.time() - idle_since >= 0.2
        writer.close()


async def test_an_idle_connection_closes_as_soon_as_the_server_shuts_down() -> None:
    shutdown = asyncio.Event()
    async with _served(60, shutdown) as port:
        reader, writer = await _answered(port)
        shutdown.set()
        async with asyncio.timeout(5):  # well before its keep-alive time
            assert await reader.read() == b""
        writer.close()


async def test_each_answer_adds_one_task_for_the_idle_wait() -> None:
    loop = asyncio.get_running_loop()
    made: list[str] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        made.append(getattr(coro, "__qualname__", type(coro).__name__))
        if factory is not None:
            return factory(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async with _served(60, asyncio.Event()) as port:
        reader, writer = await _answered(port)
        loop.set_task_factory(counting)
        try:
            for _ in range(5):
                writer.write(_REQUEST)
                await reader.readuntil(b"ok")
        finally:
            loop.set_task_factory(factory)
        writer.close()
    # Per answer: the app's task and the idle wait's, nothing else.
    assert len(made) == 10, made


async def test_an_http2_connection_without_a_stream_closes_once_its_keep_alive_time_passes() -> (
    None
):
    # Prior knowledge (h2c): Hypercorn reads the preface as an HTTP/1.1 request first, which
    # stops the keep-alive wait; without a stream closing, nothing restarted it.
    async with _served(0.2, asyncio.Event()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        async with asyncio.timeout(5):
            raw = await reader.read()  # closed by the server
        writer.close()

    assert raw[3] == 0x4  # HTTP/2: the server's SETTINGS frame first
