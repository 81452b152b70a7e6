"""UpstreamHTTP's bounds on what an upstream may send, over real sockets to a loopback server
writing scripted bytes: interim (1xx) answers before the final one. Past a bound the attempt
fails; nothing escapes the protocol's callbacks (asyncio would log "Fatal error on
transport" and the request would wait for its read timeout)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pytest

from gateway.adapters.http1 import WAITING_HEAD, Http1Connection, MalformedAnswerError
from gateway.adapters.upstream_http import UpstreamHTTP
from schemas import UpstreamError
from tests.fixtures.raw_upstream import RawReply, RawUpstream, ok

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

BODY = b'{"model": "m"}'
HEADERS = {"content-type": "application/json"}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP()
    yield client
    await client.aclose()


async def post(http: UpstreamHTTP, url: str) -> tuple[int, bytes]:
    answer = await http.post("e", url, BODY, HEADERS, timeout=5, connect_timeout=1)
    return answer.status, answer.body


def _no_fatal_error(caplog: pytest.LogCaptureFixture) -> None:
    problems = [r for r in caplog.records if r.exc_info or "Fatal error" in r.getMessage()]
    assert problems == [], [r.getMessage() for r in problems]


async def test_thousands_of_interim_answers_in_one_read_fail_the_answer_inside_the_callback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each interim answer recursed once: 3000 of them raised RecursionError out of
    # data_received, past the module's promise that nothing escapes a callback.
    caplog.set_level(logging.DEBUG)
    conn = Http1Connection(asyncio.get_running_loop(), ("http", "h", 80), set())
    conn.state = WAITING_HEAD  # as a request sent on it leaves it
    conn.data_received(CONTINUE * 3000 + ok(b"late"))
    assert isinstance(conn.error, MalformedAnswerError), conn.error
    assert "interim" in str(conn.error)
    assert (conn.complete, conn.pieces) == (False, [])
    _no_fatal_error(caplog)


async def test_too_many_interim_answers_are_a_malformed_answer_and_the_request_fails_at_once(
    http: UpstreamHTTP, raw_upstream: RawUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    raw_upstream.enqueue(RawReply(CONTINUE * 3000 + ok(b"late")), ok(b"next"))
    with pytest.raises(UpstreamError) as exc:
        await post(http, raw_upstream.url)
    assert exc.value.kind == "transport" and "interim" in exc.value.message
    _no_fatal_error(caplog)
    assert await post(http, raw_upstream.url) == (200, b"next")  # on a new connection
    assert raw_upstream.connections == 2


async def test_interim_answers_up_to_the_cap_across_reads_precede_the_answer(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + CONTINUE * 7 + ok(b"after"),
        CONTINUE * 8 + ok(b"again"),  # the count starts over for the connection's next answer
    )
    assert await post(http, raw_upstream.url) == (200, b"after")
    assert await post(http, raw_upstream.url) == (200, b"again")
    assert raw_upstream.connections == 1


async def test_interim_answers_one_byte_at_a_time_are_counted_across_reads() -> None:
    conn = Http1Connection(asyncio.get_running_loop(), ("http", "h", 80), set())
    conn.state = WAITING_HEAD
    reply = CONTINUE * 9 + ok(b"late")
    for at in range(len(reply)):
        conn.data_received(reply[at : at + 1])
    assert isinstance(conn.error, MalformedAnswerError), conn.error
