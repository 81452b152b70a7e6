"""The HTTP server's edge, through raw sockets (an SDK cannot send these): ambiguous framing
(request smuggling), unknown HTTP versions and lower-case methods are refused and the
connection closed; a body that is too large or never arrives is answered promptly; the
server's own errors come in the caller's API shape with an ``x-request-id``; and a keep-alive
connection the client closes is closed on the server's side at once.

Runs on ``inproc://`` only: nothing here crosses the bus.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas.config import ServerConfig
from tests.e2e.conftest import CHAT, WAIT, assert_openai_error, config, model, route
from tests.fixtures.gateway import RunningGateway, start_gateway
from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

LIMIT = 4096
BODY_TIMEOUT = 0.3  # seconds; the stalled-body tests wait this long for their answer
MESSAGES = "/v1/messages"
CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture
async def gw(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    """A gateway with model ``m``, a small body limit and a short body timeout."""
    running = await start_gateway(
        config(
            model("m", route(fake_upstream)),
            server={"max_body_bytes": LIMIT, "body_timeout_seconds": BODY_TIMEOUT},
        ),
        data_dir=tmp_path,
    )
    yield running
    await running.stop()


@dataclass
class Answer:
    """One HTTP answer parsed off the wire (what :func:`assert_openai_error` reads)."""

    status_code: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def parse_answers(raw: bytes) -> list[Answer]:
    """Every answer in ``raw`` (each framed by its Content-Length, or by the end of data)."""
    answers = []
    while raw:
        head, sep, raw = raw.partition(b"\r\n\r\n")
        assert sep, f"an incomplete answer head: {head!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers.get("content-length", len(raw)))
        answers.append(Answer(int(status_line.split(" ")[1]), headers, raw[:size]))
        raw = raw[size:]
    return answers


def port_of(gw: RunningGateway) -> int:
    return int(gw.url.rsplit(":", 1)[-1])


async def converse(gw: RunningGateway, data: bytes) -> list[Answer]:
    """Send ``data`` on one connection and read until the gateway closes it; every answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(WAIT):  # a gateway that keeps the connection fails here
            raw = await reader.read()
    finally:
        writer.close()
    return parse_answers(raw)


def assert_refused(answers: list[Answer], status: int) -> dict[str, Any]:
    """One OpenAI-shaped refusal that closes the connection; returns its ``error``."""
    assert [a.status_code for a in answers] == [status], answers
    (answer,) = answers
    assert answer.headers["connection"] == "close"
    assert answer.headers["x-request-id"]
    return assert_openai_error(answer, status)


def assert_anthropic_refusal(answers: list[Answer], status: int) -> str:
    """One Anthropic-shaped refusal that closes the connection; returns its message."""
    assert [a.status_code for a in answers] == [status], answers
    (answer,) = answers
    assert answer.headers["connection"] == "close"
    assert answer.headers["x-request-id"]
    body = answer.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == "invalid_request_error", body
    return str(body["error"]["message"])


# -- bodies --------------------------------------------------------------------------------


def test_body_timeout_defaults_to_30_seconds() -> None:
    assert ServerConfig().body_timeout_seconds == 30


async def test_declared_10_gb_body_is_413_before_a_byte_of_it_is_sent(
    gw: RunningGateway,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
    try:
        writer.write(
            f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\ncontent-type: application/json"
            f"\r\ncontent-length: {10 * 1024**3}\r\n\r\n".encode()
        )
        await writer.drain()
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
            (answer,) = parse_answers(head)  # the head alone: its body is still to come
            body = await reader.readexactly(int(answer.headers["content-length"]))
            rest = await reader.read()  # then the gateway closes the connection
    finally:
        writer.close()

    answer.body = body
    err = assert_openai_error(answer, 413, "request_too_large")
    assert str(LIMIT) in err["message"]
    assert answer.headers["connection"] == "close"
    assert rest == b""


@pytest.mark.parametrize(
    "stalled",
    [
        b'transfer-encoding: chunked\r\n\r\n5\r\n{"mod',
        b'content-length: 100\r\n\r\n{"model": ',
    ],
    ids=["chunked-never-ends", "short-content-length"],
)
async def test_stalled_body_is_408_and_the_connection_closes(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    stalled: bytes,
) -> None:
    answers = await converse(gw, f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\n".encode() + stalled)

    assert [a.status_code for a in answers] == [408], answers
    err = assert_openai_error(answers[0], 408, "request_timeout")
    assert f"{BODY_TIMEOUT:g}" in err["message"]
    assert answers[0].headers["connection"] == "close"
    assert fake_upstream.requests == []


async def test_stalled_body_on_messages_is_408_in_anthropic_shape(gw: RunningGateway) -> None:
    answers = await converse(
        gw, f"POST {MESSAGES} HTTP/1.1\r\nhost: llmgw\r\ncontent-length: 10\r\n\r\n{{".encode()
    )

    assert [a.status_code for a in answers] == [408], answers
    assert answers[0].json()["type"] == "error"
