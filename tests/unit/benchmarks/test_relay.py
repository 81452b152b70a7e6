"""tests/benchmarks/relay.py, the byte relay ``bench.py --targets floor`` measures: what a
client sends reaches the upstream unchanged, the answer comes back whole however large, and a
close on either side closes the other; and the floor row reads into the added-p50 line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
from typing import TYPE_CHECKING

import pytest

from tests.benchmarks.bench import StepResult, report
from tests.benchmarks.relay import serve
from tests.unit.benchmarks.rows import step_row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _relayed(handler: Handler) -> AsyncIterator[int]:
    """An upstream running ``handler`` on loopback and the relay in front of it; the
    relay's port."""
    writers: list[asyncio.StreamWriter] = []

    async def serving(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    upstream = await asyncio.start_server(serving, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    relay = asyncio.create_task(serve(f"http://127.0.0.1:{port}", 0, ready))
    try:
        yield await ready
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        upstream.close()
        await upstream.wait_closed()
        for writer in writers:  # the upstream's side of each connection, however it ended
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def test_bytes_go_through_both_ways_on_one_kept_connection() -> None:
    heard: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            heard.append(line)
            writer.write(b"echo " + line)
            await writer.drain()
        writer.close()

    async with _relayed(upstream) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for word in (b"one\n", b"two\n"):
            writer.write(word)
            assert await reader.readline() == b"echo " + word
        writer.close()
        await writer.wait_closed()

    assert heard == [b"one\n", b"two\n"]  # one upstream connection carried both


async def test_a_large_answer_arrives_whole_to_a_slow_reader() -> None:
    answer = bytes(range(256)) * 32 * 1024  # 8 MiB: far past any socket buffer

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(answer)
        await writer.drain()
        writer.close()

    async with _relayed(upstream) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=4096)
        writer.write(b"go\n")
        got = hashlib.sha256()
        size = 0
        while piece := await reader.read(4096):
            got.update(piece)
            size += len(piece)
            if size < len(answer) // 2:
                await asyncio.sleep(0)  # read slowly at first: the relay must hold, not drop
        writer.close()
        await writer.wait_closed()

    assert size == len(answer)
    assert got.digest() == hashlib.sha256(answer).digest()


async def test_the_upstream_closing_closes_the_client() -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"bye\n")
        writer.close()

    async with _relayed(upstream) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hi\n")
        assert await asyncio.wait_for(reader.read(), 5) == b"bye\n"  # then the end
        writer.close()
        await writer.wait_closed()


async def test_the_client_closing_closes_the_upstream_side() -> None:
    ended = asyncio.Event()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the relay closes its side
        ended.set()
        writer.close()

    async with _relayed(upstream) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hi\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        await asyncio.wait_for(ended.wait(), 5)


async def test_only_a_loopback_upstream_is_relayed() -> None:
    with pytest.raises(ValueError, match="loopback"):
        await serve("http://192.0.2.1:80")


def _row(target: str, p50_ms: float) -> StepResult:
    return step_row(target=target, concurrency=1, p50_ms=p50_ms)


def test_the_added_p50_line_splits_the_floor_from_the_gateways_own() -> None:
    rows = [_row("direct", 0.20), _row("floor", 0.28), _row("gateway", 0.62)]

    text = report(rows, argparse.Namespace(modes=["plain"]), markdown=True)

    assert (
        "added p50 at concurrency 1, plain: 0.42 ms (gateway 0.62 minus direct 0.20; meets "
        "the ≤ 1 ms target); a byte relay in its place adds 0.08 ms (floor 0.28), so 0.34 ms "
        "is the gateway's own"
    ) in text
