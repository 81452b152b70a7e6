"""UpstreamHTTP's own HTTP/1.1 client against a loopback server writing scripted bytes: the
connection pool (keep-alive, an idle connection the upstream closed, an abandoned stream),
the answer's framing and content encodings, and each failure's kind."""

from __future__ import annotations

import asyncio
import gzip
import socket
import zlib
from typing import TYPE_CHECKING

import pytest
import uvloop

from gateway.adapters.http1 import WAITING_HEAD, Http1Connection
from gateway.adapters.upstream_http import UpstreamHTTP
from schemas import UpstreamError, UpstreamTimeoutError
from tests.fixtures.raw_upstream import RawReply, RawUpstream, ok, self_signed_tls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

BODY = b'{"model": "m"}'
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-1"}
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP()
    yield client
    await client.aclose()


async def post(http: UpstreamHTTP, url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    answer = await http.post("e", url, BODY, HEADERS, timeout=timeout, connect_timeout=1)
    return answer.status, answer.body


async def test_sequential_requests_to_one_origin_share_one_kept_alive_connection(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(ok(b"a"), ok(b"b"), ok(b"c"))
    bodies = [(await post(http, raw_upstream.url))[1] for _ in range(3)]
    assert bodies == [b"a", b"b", b"c"]
    assert raw_upstream.connections == 1


async def test_the_request_carries_host_length_the_callers_headers_and_the_body_framing(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(ok(b"{}"))
    await post(http, raw_upstream.url + "?api-version=1")
    head = raw_upstream.requests[0].split("\r\n")
    assert head[0] == "POST /v1/chat/completions?api-version=1 HTTP/1.1"
    lines = {line.partition(": ")[0].lower(): line.partition(": ")[2] for line in head[1:]}
    assert lines["host"] == f"127.0.0.1:{raw_upstream.port}"
    assert lines["content-length"] == str(len(BODY))
    assert lines["authorization"] == "Bearer sk-1"
    assert lines["content-type"] == "application/json"
    assert lines["accept-encoding"] == "gzip, deflate"  # as aiohttp sent: decoded here
    assert "cookie" not in lines


async def test_a_header_value_with_a_line_break_is_refused_before_sending(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    with pytest.raises(ValueError, match="line break"):
        await http.post(
            "e", raw_upstream.url, BODY, {"x": "a\r\nEvil: 1"}, timeout=5, connect_timeout=1
        )
    assert raw_upstream.requests == []


async def test_an_idle_connection_the_upstream_closed_is_not_reused(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(RawReply(ok(b"first"), half=True), ok(b"second"))
    assert await post(http, raw_upstream.url) == (200, b"first")
    # The upstream sent EOF after its answer; its side ends once the client closed too.
    await raw_upstream.closed.acquire()
    assert await post(http, raw_upstream.url) == (200, b"second")
    assert raw_upstream.connections == 2


async def test_at_the_connection_limit_a_request_waits_for_one_in_use(
    raw_upstream: RawUpstream,
) -> None:
    raw_upstream.enqueue(ok(b"a"), ok(b"b"), ok(b"c"))
    http = UpstreamHTTP(limit=1)
    try:
        answers = await asyncio.gather(*(post(http, raw_upstream.url) for _ in range(3)))
    finally:
        await http.aclose()
    assert sorted(body for _, body in answers) == [b"a", b"b", b"c"]
    assert raw_upstream.connections == 1  # without the limit, three opened at once


async def test_an_idle_connection_past_its_keep_alive_is_closed(
    raw_upstream: RawUpstream,
) -> None:
    raw_upstream.enqueue(ok(b"a"), ok(b"b"))
    http = UpstreamHTTP(keepalive_seconds=0.0)
    try:
        assert await post(http, raw_upstream.url) == (200, b"a")
        await raw_upstream.closed.acquire()  # the sweep closed it, with no request waiting
        assert await post(http, raw_upstream.url) == (200, b"b")
    finally:
        await http.aclose()
    assert raw_upstream.connections == 2


async def test_an_answer_saying_connection_close_is_not_pooled(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(ok(b"a", "Connection: close"), ok(b"b"))
    assert await post(http, raw_upstream.url) == (200, b"a")
    assert await post(http, raw_upstream.url) == (200, b"b")
    assert raw_upstream.connections == 2


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        (ok(b"hello"), b"hello"),
        (
            CHUNKED + b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nx-t: 1\r\n\r\n",
            b"hello world",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after"), b"after"),
    ],
    ids=["content-length", "chunked", "close-delimited", "no-content", "interim"],
)
async def test_each_framing_yields_the_whole_body(
    http: UpstreamHTTP, raw_upstream: RawUpstream, reply: bytes, body: bytes
) -> None:
    raw_upstream.enqueue(RawReply(reply, close=b"until" in reply))
    assert (await post(http, raw_upstream.url))[1] == body


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        (ok(b"hello"), b"hello"),
        (
            CHUNKED + b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nx-t: 1\r\n\r\n",
            b"hello world",
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after"), b"after"),
        (ok(gzip.compress(b"zipped" * 50), "Content-Encoding: gzip"), b"zipped" * 50),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end"),
    ],
    ids=["content-length", "chunked", "interim", "gzip", "close-delimited"],
)
async def test_an_answer_arriving_one_byte_at_a_time_is_framed_the_same(
    reply: bytes, body: bytes
) -> None:
    conn = Http1Connection(asyncio.get_running_loop(), ("http", "h", 80), set())
    conn.state = WAITING_HEAD  # as a request sent on it leaves it
    for at in range(len(reply)):
        conn.data_received(reply[at : at + 1])
    if not conn.complete:
        conn.eof_received()  # the close that ends a close-delimited answer
    assert (conn.error, conn.complete, b"".join(conn.pieces)) == (None, True, body)


def _deflated(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", gzip.compress(b"x" * 5000)),
        ("deflate", _deflated(b"x" * 5000, zlib.MAX_WBITS)),
        ("deflate", _deflated(b"x" * 5000, -zlib.MAX_WBITS)),  # raw, as some servers send
    ],
    ids=["gzip", "deflate", "raw-deflate"],
)
async def test_a_compressed_answer_is_decompressed(
    http: UpstreamHTTP, raw_upstream: RawUpstream, encoding: str, packed: bytes
) -> None:
    raw_upstream.enqueue(ok(packed, f"Content-Encoding: {encoding}"))
    answer = await http.post("e", raw_upstream.url, BODY, HEADERS, timeout=5, connect_timeout=1)
    assert answer.body == b"x" * 5000
    assert answer.headers["content-encoding"] == encoding  # the headers as received


async def test_a_gzip_stream_is_decompressed_as_it_arrives(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    packed = gzip.compress(b"data: 1\n\n" * 100)
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (packed[:10], packed[10:]))
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw_upstream.enqueue(head + chunks + b"0\r\n\r\n")
    async with http.stream(
        "e", raw_upstream.url, BODY, HEADERS, timeout=5, connect_timeout=1
    ) as resp:
        body = b"".join([piece async for piece in resp.chunks()])
    assert (resp.status, body) == (200, b"data: 1\n\n" * 100)


async def test_a_stream_larger_than_its_buffer_arrives_whole_and_its_connection_is_reused(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB, over the 256 KiB a stream buffers unread
    raw_upstream.enqueue(ok(big), ok(b"next"))
    async with http.stream(
        "e", raw_upstream.url, BODY, HEADERS, timeout=5, connect_timeout=1
    ) as resp:
        body = b"".join([piece async for piece in resp.chunks()])
    assert body == big
    assert await post(http, raw_upstream.url) == (200, b"next")
    assert raw_upstream.connections == 1


async def test_an_abandoned_stream_closes_its_connection_and_the_next_request_opens_one(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(CHUNKED + b"5\r\nfirst\r\n", ok(b"next"))  # the rest never comes
    async with http.stream(
        "e", raw_upstream.url, BODY, HEADERS, timeout=5, connect_timeout=1
    ) as resp:
        async for piece in resp.chunks():
            assert piece == b"first"
            break
    await raw_upstream.closed.acquire()  # the upstream saw its client go
    assert await post(http, raw_upstream.url) == (200, b"next")
    assert raw_upstream.connections == 2


async def test_a_silent_upstream_is_a_read_timeout(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    with pytest.raises(UpstreamTimeoutError) as exc:
        await post(http, raw_upstream.url, timeout=0.2)  # nothing queued: no answer
    assert exc.value.kind == "timeout"


async def test_a_stream_that_stalls_mid_body_is_a_read_timeout(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(CHUNKED + b"5\r\nfirst\r\n")
    async with http.stream(
        "e", raw_upstream.url, BODY, HEADERS, timeout=0.2, connect_timeout=1
    ) as resp:
        pieces = resp.chunks()
        assert await anext(pieces) == b"first"
        with pytest.raises(UpstreamTimeoutError) as exc:
            await anext(pieces)
    assert exc.value.kind == "timeout"


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port whose listen queue is full: a new connection's SYN goes unanswered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        try:
            yield port
        finally:
            for filler in fillers:
                filler.close()


async def test_a_connection_that_is_not_accepted_in_time_is_a_connect_timeout(
    http: UpstreamHTTP, full_backlog: int
) -> None:
    url = f"http://127.0.0.1:{full_backlog}/v1/x"
    with pytest.raises(UpstreamTimeoutError) as exc:
        await http.post("e", url, BODY, HEADERS, timeout=5, connect_timeout=0.2)
    assert exc.value.kind == "timeout"


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 2OO OK\r\n\r\n",
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n",
        CHUNKED + b"5\r\nhelloXX0\r\n\r\n",
        ok(b"not gzip", "Content-Encoding: gzip"),
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    ],
    ids=["status", "protocol", "length", "header", "chunk-size", "chunk-end", "gzip", "cut-short"],
)
async def test_a_malformed_or_cut_answer_is_a_transport_error(
    http: UpstreamHTTP, raw_upstream: RawUpstream, reply: bytes
) -> None:
    raw_upstream.enqueue(RawReply(reply, close=True))
    with pytest.raises(UpstreamError) as exc:
        await post(http, raw_upstream.url)
    assert exc.value.kind == "transport" and not isinstance(exc.value, UpstreamTimeoutError)


async def test_a_cancelled_request_closes_its_connection(
    http: UpstreamHTTP, raw_upstream: RawUpstream
) -> None:
    task = asyncio.ensure_future(post(http, raw_upstream.url))  # never answered
    await raw_upstream.received.acquire()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await raw_upstream.closed.acquire()


async def test_an_https_upstream_is_reached_over_tls_with_its_certificate_verified(
    http: UpstreamHTTP, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls, cert = self_signed_tls(tmp_path)
    server = await RawUpstream().start(tls)
    try:
        server.enqueue(ok(b"over tls"), ok(b"again"))
        url = f"https://localhost:{server.port}/v1/chat/completions"
        with pytest.raises(UpstreamError) as exc:  # the default trust store does not know it
            await post(http, url)
        assert exc.value.kind == "connect"
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read when a context is made
        trusting = UpstreamHTTP()
        try:
            assert await post(trusting, url) == (200, b"over tls")
            assert await post(trusting, url) == (200, b"again")
        finally:
            await trusting.aclose()
        assert server.requests[0].split("\r\n")[1] == f"Host: localhost:{server.port}"
        assert server.connections == 1  # kept alive (a failed handshake is never counted)
    finally:
        await server.close()


def test_on_uvloop_the_client_keeps_alive_streams_and_times_out() -> None:
    """The tests above run on asyncio's loop; ``llmgw serve`` runs uvloop, whose transports
    are not asyncio's classes: the main paths once more on it."""

    async def scenario() -> None:
        server = await RawUpstream().start()
        http = UpstreamHTTP()
        try:
            server.enqueue(ok(b"a"), RawReply(ok(b"b"), half=True))
            assert [(await post(http, server.url))[1] for _ in range(2)] == [b"a", b"b"]
            await server.closed.acquire()
            server.enqueue(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n", CHUNKED + b"2\r\nhi\r\n")
            async with http.stream(
                "e", server.url, BODY, HEADERS, timeout=0.2, connect_timeout=1
            ) as resp:
                assert b"".join([piece async for piece in resp.chunks()]) == b"hello"
            with pytest.raises(UpstreamTimeoutError):
                await post(http, server.url, timeout=0.2)  # "hi", then silence
            assert server.connections == 2
        finally:
            await http.aclose()
            await server.close()

    uvloop.run(scenario())
