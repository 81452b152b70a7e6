"""HTTP/2 with prior knowledge (h2c) on every engine, with the official openai SDK over an
HTTP/2-only ``httpx`` client: a chat completion, a streamed one, and concurrent requests
(multiplexed on one connection: tests/unit/gateway/process/test_h1_engine.py). The builtin
engine hands such connections to Hypercorn's HTTP/2 (gateway/process/h1/h2_handoff.py). And a
stream's request data arriving after its answer leaves the connection's other streams served."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httpx
import pytest

from tests.e2e.conftest import CHAT, HI, WAIT, config, model, route
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture
async def gw(
    fake_upstream: FakeUpstream, tmp_path: Path, engine: str
) -> AsyncIterator[RunningGateway]:
    running = await start_gateway(
        config(model("m", route(fake_upstream)), server={"engine": engine}),
        data_dir=tmp_path,
    )
    yield running
    await running.stop()


@pytest.fixture
async def versions() -> list[str]:
    """The HTTP version of each answer the client below received."""
    return []


@pytest.fixture
async def httpx_h2(versions: list[str]) -> AsyncIterator[httpx.AsyncClient]:
    async def note(response: httpx.Response) -> None:
        versions.append(response.http_version)

    async with httpx.AsyncClient(
        http1=False, http2=True, event_hooks={"response": [note]}
    ) as client:
        yield client


async def test_a_chat_completion_and_a_stream_are_served_over_http2(
    gw: RunningGateway, httpx_h2: httpx.AsyncClient, versions: list[str]
) -> None:
    client = gw.openai(http_client=httpx_h2)

    answer = await client.chat.completions.create(model="m", messages=HI)
    stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
    parts = [chunk async for chunk in stream]

    assert answer.model == "m" and answer.choices[0].message.content
    assert parts and parts[-1].choices[0].finish_reason == "stop"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert versions == ["HTTP/2", "HTTP/2"]


async def test_concurrent_requests_over_http2_are_all_served(
    gw: RunningGateway, httpx_h2: httpx.AsyncClient, versions: list[str]
) -> None:
    client = gw.openai(http_client=httpx_h2)

    answers = await asyncio.gather(
        *(client.chat.completions.create(model="m", messages=HI) for _ in range(8))
    )

    assert all(a.choices[0].message.content for a in answers)
    assert versions == ["HTTP/2"] * 8


class H2Client:
    """A bare HTTP/2 client on one connection (the ``h2`` library): frames sent as the test
    says, answers read per stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._h2.initiate_connection()
        self.status: dict[int, int] = {}
        self.ended: set[int] = set()

    def headers(self, stream: int, method: str, path: str, *extra: tuple[bytes, bytes]) -> None:
        head = [
            (b":method", method.encode()),
            (b":path", path.encode()),
            (b":scheme", b"http"),
            (b":authority", b"llmgw"),
            *extra,
        ]
        self._h2.send_headers(stream, head, end_stream=method == "GET")
        self._flush()

    def data(self, stream: int, data: bytes, *, end: bool) -> None:
        """Send ``data`` on ``stream`` unless the server has reset it (granian's hyper resets
        a stream it answered before its request ended)."""
        try:
            self._h2.send_data(stream, data, end_stream=end)
        except h2.exceptions.StreamClosedError:
            return
        self._flush()

    async def answered(self, stream: int) -> int:
        """Read until ``stream``'s answer has ended; its status."""
        async with asyncio.timeout(WAIT):
            while stream not in self.ended:
                data = await self._reader.read(65536)
                assert data, "the gateway closed the connection"
                for event in self._h2.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        self.status[event.stream_id] = int(dict(event.headers)[b":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        self._h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        self.ended.add(event.stream_id)
                self._flush()
        return self.status[stream]

    def _flush(self) -> None:
        self._writer.write(self._h2.data_to_send())


@pytest.fixture
async def bare_h2(gw: RunningGateway) -> AsyncIterator[H2Client]:
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield H2Client(reader, writer)
    finally:
        writer.close()


async def test_a_body_ended_after_its_answer_leaves_the_connection_serving(
    bare_h2: H2Client,
) -> None:
    # The gateway answers once the declared Content-Length is in; the frame that ends the
    # body comes after the answer (Hypercorn alone then tears the connection down).
    length = (b"content-length", str(len(CHAT_BODY)).encode())
    bare_h2.headers(1, "POST", CHAT, (b"content-type", b"application/json"), length)
    bare_h2.data(1, CHAT_BODY, end=False)
    first = await bare_h2.answered(1)
    bare_h2.data(1, b"", end=True)
    bare_h2.headers(3, "GET", "/health")

    assert first == 200
    assert await bare_h2.answered(3) == 200
