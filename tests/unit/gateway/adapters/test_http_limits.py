"""UpstreamHTTP's bounds on what an upstream may send, over real sockets to a loopback server
writing scripted bytes: interim (1xx) answers before the final one, a whole answer's body as
received and as inflated (a gzip bomb), an error answer's body, one read of a compressed
stream. Past a bound the attempt fails; nothing escapes the protocol's callbacks (asyncio
would log "Fatal error on transport" and the request would wait for its read timeout)."""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import TYPE_CHECKING

import pytest

from gateway.adapters import http1
from gateway.adapters.base import UpstreamTarget
from gateway.adapters.http1 import (
    ERROR_BODY_MAX,
    WAITING_HEAD,
    AnswerTooLargeError,
    Http1Connection,
    MalformedAnswerError,
)
from gateway.adapters.registry import Upstreams
from gateway.adapters.upstream_http import UpstreamHTTP
from schemas import UpstreamBadResponseError, UpstreamError
from schemas.config import GatewayConfig
from schemas.process_config import MAX_UPSTREAM_ANSWER_BYTES
from tests.fixtures.raw_upstream import RawReply, RawUpstream, ok

# Loopback, but under a loaded machine (the whole suite beside): 1 s to connect once timed out.
WAIT = 10.0

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
    answer = await http.post("e", url, BODY, HEADERS, timeout=WAIT, connect_timeout=WAIT)
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


BOUND = 64 * 1024  # a small max_answer_bytes: a bomb just over it stays cheap to make
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def gzipped(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


@pytest.fixture
async def bounded() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP(max_answer_bytes=BOUND)
    yield client
    await client.aclose()


def _bounded_conn(limit: int, *, whole: bool = True) -> Http1Connection:
    conn = Http1Connection(asyncio.get_running_loop(), ("http", "h", 80), set())
    conn.state, conn.limit, conn.whole = WAITING_HEAD, limit, whole
    return conn


async def test_a_gzip_bomb_is_inflated_no_further_than_the_bound() -> None:
    # It was inflated whole: 1 MiB on the wire became 1 GiB in memory. Here 8 MiB of zeros
    # (8 kB gzipped) against a 64 KiB bound: at most the bound and a byte is ever inflated.
    conn = _bounded_conn(BOUND)
    conn.data_received(ok(gzipped(bytes(8 * 1024 * 1024)), "Content-Encoding: gzip"))
    assert isinstance(conn.error, AnswerTooLargeError), conn.error
    assert sum(map(len, conn.pieces)) <= BOUND
    assert conn.closed and not conn.complete


@pytest.mark.parametrize(
    "reply",
    [
        ok(gzipped(bytes(BOUND + 1)), "Content-Encoding: gzip"),
        CHUNKED.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
        + chunked(*[gzipped(bytes(BOUND + 1))[i : i + 7] for i in range(0, 200, 7)]),
        ok(b"x" * (BOUND + 1)),  # refused on its Content-Length, before a byte is read
        CHUNKED + chunked(b"x" * BOUND, b"y"),
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (BOUND + 1),  # close-delimited
    ],
    ids=["gzip", "gzip-chunked", "length", "chunked", "close-delimited"],
)
async def test_a_whole_answer_over_the_bound_is_a_bad_response(
    bounded: UpstreamHTTP,
    raw_upstream: RawUpstream,
    reply: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    raw_upstream.enqueue(RawReply(reply, close=True), ok(b"next"))
    with pytest.raises(UpstreamBadResponseError) as exc:
        await post(bounded, raw_upstream.url)
    err = exc.value
    assert (err.kind, err.status, err.counts_against_endpoint) == ("bad_response", None, True)
    assert f"over {BOUND} bytes" in err.message, err.message
    _no_fatal_error(caplog)
    assert await post(bounded, raw_upstream.url) == (200, b"next")  # the pool is sound


@pytest.mark.parametrize(
    "reply",
    [
        ok(gzipped(b"x" * BOUND), "Content-Encoding: gzip"),
        ok(b"x" * BOUND),
        CHUNKED + chunked(b"x" * (BOUND - 1), b"x"),
    ],
    ids=["gzip", "length", "chunked"],
)
async def test_a_whole_answer_of_exactly_the_bound_arrives_whole(
    bounded: UpstreamHTTP, raw_upstream: RawUpstream, reply: bytes
) -> None:
    raw_upstream.enqueue(reply, ok(b"next"))
    assert await post(bounded, raw_upstream.url) == (200, b"x" * BOUND)
    assert await post(bounded, raw_upstream.url) == (200, b"next")
    assert raw_upstream.connections == 1


@pytest.mark.parametrize("encoded", [False, True], ids=["plain", "gzip"])
async def test_an_error_answers_body_is_cut_at_its_bound_and_its_status_kept(
    http: UpstreamHTTP, raw_upstream: RawUpstream, encoded: bool
) -> None:
    # A 5xx whose body was a 64 MiB JSON message went to the client verbatim; then, bounded,
    # a 422 echoing a large request became a 502 charged to the route: an error answer's
    # status says what went wrong whatever its size, so its body is cut, not refused.
    message = b'{"error": {"message": "' + b"m" * ERROR_BODY_MAX + b'"}}'
    head = b"HTTP/1.1 422 Unprocessable Entity\r\n"
    if encoded:
        head += b"Content-Encoding: gzip\r\n"
        message = gzipped(message)
    reply = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(message)
    raw_upstream.enqueue(RawReply(reply), RawReply(reply))

    whole = await post(http, raw_upstream.url)
    async with http.stream(
        "e", raw_upstream.url, BODY, HEADERS, timeout=WAIT, connect_timeout=WAIT
    ) as resp:
        streamed = (resp.status, await resp.read())

    for status, body in (whole, streamed):
        assert status == 422
        assert len(body) == ERROR_BODY_MAX and body.startswith(b'{"error": {"message": "mmm')


async def test_an_error_answer_declaring_a_length_over_its_bound_is_read_to_it(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    body = b"e" * (ERROR_BODY_MAX + 10)
    raw_upstream.enqueue(ok(body).replace(b"200 OK", b"400 Bad Request"))

    assert await post(http, raw_upstream.url) == (400, body[:ERROR_BODY_MAX])


async def test_a_deflated_answer_whose_head_comes_alone_is_inflated() -> None:
    # The kind of deflate (zlib-wrapped or raw) was guessed from a first piece that was
    # empty: raw, and a zlib-wrapped body then failed ("invalid stored block lengths").
    body = zlib.compress(b'{"ok": true}')
    conn = _bounded_conn(BOUND)

    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\n")
    conn.data_received(b"Content-Length: %d\r\n\r\n" % len(body))
    conn.data_received(body)

    assert conn.error is None and conn.complete
    assert b"".join(conn.pieces) == b'{"ok": true}'


async def test_an_error_answer_under_its_bound_is_read_whole(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    body = b"e" * (ERROR_BODY_MAX // 2)
    raw_upstream.enqueue(ok(body).replace(b"200 OK", b"503 Busy"))
    answer = await http.post(
        "e", raw_upstream.url, BODY, HEADERS, timeout=WAIT, connect_timeout=WAIT
    )
    assert (answer.status, answer.body) == (503, body)


async def test_a_stream_has_no_bound_on_its_whole_body_but_one_read_inflates_to_at_most_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "STREAM_INFLATE_MAX", 1000)
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn = _bounded_conn(0, whole=False)
    conn.data_received(head)
    for _ in range(5):  # 5 reads of 900 bytes each: 4500 in all, over the cap, and fine
        piece = packer.compress(b"data: 1\n\n" * 100) + packer.flush(zlib.Z_SYNC_FLUSH)
        conn.data_received(chunked(piece)[:-5])  # the chunk, not the last one
    assert conn.error is None, conn.error
    assert b"".join(conn.pieces) == b"data: 1\n\n" * 500
    bomb = packer.compress(bytes(1_000_000)) + packer.flush(zlib.Z_SYNC_FLUSH)
    conn.data_received(chunked(bomb)[:-5])
    assert isinstance(conn.error, AnswerTooLargeError), conn.error
    assert "one read inflates to over 1000 bytes" in str(conn.error)
    assert len(b"".join(conn.pieces)) == 4500  # nothing of the bomb was kept


async def test_a_gzip_stream_whose_read_is_a_bomb_fails_as_a_bad_response(
    http: UpstreamHTTP, raw_upstream: RawUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http1, "STREAM_INFLATE_MAX", 64 * 1024)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw_upstream.enqueue(RawReply(head + chunked(gzipped(bytes(8 * 1024 * 1024))), close=True))
    with pytest.raises(UpstreamBadResponseError) as exc:
        async with http.stream(
            "e", raw_upstream.url, BODY, HEADERS, timeout=WAIT, connect_timeout=WAIT
        ) as resp:
            await resp.read()
    assert exc.value.kind == "bad_response"


def test_the_bound_is_a_server_setting_of_256_mib_by_default_and_positive() -> None:
    assert GatewayConfig().server.max_upstream_answer_bytes == MAX_UPSTREAM_ANSWER_BYTES
    assert MAX_UPSTREAM_ANSWER_BYTES == 256 * 1024 * 1024
    assert UpstreamHTTP().max_answer_bytes == MAX_UPSTREAM_ANSWER_BYTES
    with pytest.raises(ValueError, match="greater than 0"):
        GatewayConfig.model_validate({"server": {"max_upstream_answer_bytes": 0}})


async def test_the_configured_bound_reaches_the_adapters_and_follows_a_reload(
    raw_upstream: RawUpstream,
) -> None:
    choice = b'{"index": 0, "message": {"role": "assistant", "content": "hi"}}'
    answer = b'{"choices": [' + choice + b'], "pad": "' + b" " * BOUND + b'"}'
    raw_upstream.enqueue(RawReply(ok(answer), close=True), ok(answer))
    upstreams = Upstreams(max_answer_bytes=BOUND)
    await upstreams.start()
    target = UpstreamTarget(
        endpoint="e",
        kind="openai_compat",
        base_url=f"http://127.0.0.1:{raw_upstream.port}/v1",
        upstream_model="m",
        api_key=None,
        timeout=5,
        connect_timeout=WAIT,
    )
    adapter = upstreams.adapters["openai_compat"]
    try:
        with pytest.raises(UpstreamBadResponseError):
            await adapter.complete(target, {"messages": []})
        reloaded = {"server": {"max_upstream_answer_bytes": 2 * BOUND}}
        upstreams.reconfigure(GatewayConfig.model_validate(reloaded))
        answered = await adapter.complete(target, {"messages": []})
        assert answered["choices"][0]["message"]["content"] == "hi"
    finally:
        await upstreams.aclose()
