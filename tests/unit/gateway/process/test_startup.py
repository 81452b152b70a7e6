"""``gateway.process.startup``: the wait for a gateway's first answer ends with it, with what
ended the server or the ingress operations first, or with SIGTERM; and a failure while the
bus dropped is told from a bug."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

import pytest

from bus import BusClosedError, InProcessBus
from gateway.http.lifespan import LifespanError
from gateway.process.startup import lost_bus, until_started

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

WAIT = 10.0


@pytest.fixture
async def never_accepting() -> AsyncIterator[int]:
    """A port that listens and never accepts: a connection waits in its backlog, as one to a
    server whose app is still starting."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


async def _fail(after: asyncio.Event, exc: BaseException) -> None:
    await after.wait()
    raise exc


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_server_failing_before_it_answers_raises_its_failure_at_once(
    never_accepting: int,
) -> None:
    # The wait read its /health answer with no bound: a server that never accepted kept it
    # waiting forever.
    go = asyncio.Event()
    failure = LifespanError("the app's lifespan raised BusClosedError()")
    server = asyncio.create_task(_fail(go, failure))
    asyncio.get_running_loop().call_later(0.05, go.set)

    with pytest.raises(LifespanError) as raised:
        async with asyncio.timeout(WAIT):
            await until_started("127.0.0.1", never_accepting, server, None, asyncio.Event())

    assert raised.value is failure


async def test_the_ingress_operations_failing_before_it_answers_stop_the_server(
    never_accepting: int,
) -> None:
    go = asyncio.Event()
    server = asyncio.create_task(_forever())
    ops = asyncio.create_task(_fail(go, BusClosedError("cannot subscribe to x")))
    asyncio.get_running_loop().call_later(0.05, go.set)

    with pytest.raises(BusClosedError):
        async with asyncio.timeout(WAIT):
            await until_started("127.0.0.1", never_accepting, server, ops, asyncio.Event())

    assert server.cancelled()


async def test_shutdown_before_it_answers_stops_the_server_and_says_so(
    never_accepting: int,
) -> None:
    shutdown = asyncio.Event()
    server = asyncio.create_task(_forever())
    asyncio.get_running_loop().call_later(0.05, shutdown.set)

    async with asyncio.timeout(WAIT):
        started = await until_started("127.0.0.1", never_accepting, server, None, shutdown)

    assert started is False and server.cancelled()


async def test_an_answer_to_health_is_a_start() -> None:
    async def health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(health, "127.0.0.1", 0)
    port = int(listening.sockets[0].getsockname()[1])
    server = asyncio.create_task(_forever())
    try:
        async with asyncio.timeout(WAIT):
            started = await until_started("127.0.0.1", port, server, None, asyncio.Event())
    finally:
        server.cancel()
        listening.close()
        await listening.wait_closed()

    assert started is True


def test_a_bus_failure_carried_by_a_start_failure_is_the_bus_lost() -> None:
    bus = InProcessBus()
    closed = BusClosedError("cannot subscribe to llmgw.auth.keys.changed: TimeoutError()")
    try:
        raise LifespanError("the app's lifespan raised") from closed
    except LifespanError as exc:
        carried = exc
    grouped = ExceptionGroup("unhandled errors in a TaskGroup", [closed])

    assert lost_bus(carried, bus) == closed.message
    assert lost_bus(grouped, bus) == closed.message
    assert lost_bus(RuntimeError("a bug"), bus) is None
