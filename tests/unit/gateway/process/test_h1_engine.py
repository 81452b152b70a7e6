"""The builtin engine (gateway/process/h1) under small ASGI apps, over real loopback sockets:
answers framed by length or chunked, pipelined requests served one at a time in order, bodies
(chunked, ``Expect: 100-continue``), the client going away, the app failing, idle
connections closed, and a graceful stop that finishes the answer under way; HTTP/2 with prior
knowledge (multiplexed streams, a preface in pieces, a stop).

The framing refusals (smuggling, lenient heads, versions, timeouts) are the e2e suite's
(tests/e2e/test_http_edge.py), run on every engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.process.h1 import server as h1_server
from gateway.process.h1.connection import PREFACE
from gateway.process.h1.server import serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping

    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]

WAIT = 5.0
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
# A frame of a type no one knows (ignored), then a frame head announcing 16 MiB never sent.
JUNK_FRAMES = b"\x00\x00\x05\x99\x00\x00\x00\x00\x01hello" + b"\xff" * 50


class Served:
    """A running builtin server: its port, its stop, and what its app saw."""

    def __init__(self, port: int, shutdown: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.port = port
        self.shutdown = shutdown
        self.task = task

    async def stop(self) -> None:
        self.shutdown.set()
        async with asyncio.timeout(WAIT):
            await self.task


@contextlib.asynccontextmanager
async def served(app: Any, header_timeout: float = 5.0, **kwargs: Any) -> AsyncIterator[Served]:
    """``app`` served by the builtin engine on a free loopback port until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections made before the server accepts wait in the backlog
    port = sock.getsockname()[1]
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        serve(app, sock, header_timeout=header_timeout, shutdown=shutdown, **kwargs)
    )
    running = Served(port, shutdown, task)
    try:
        yield running
    finally:
        if not task.done():
            await running.stop()


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        async with asyncio.timeout(WAIT):
            return await reader.read()
    finally:
        writer.close()


def lifespan_aware(handler: Callable[[Any, Receive, Send], Awaitable[None]]) -> Any:
    async def app(scope: Any, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await handler(scope, receive, send)

    return app


async def read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


@lifespan_aware
async def echo(scope: Any, receive: Receive, send: Send) -> None:
    """Answers the request's method, path and body, with a length."""
    body = await read_body(receive)
    answer = f"{scope['method']} {scope['path']} ".encode() + body
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@lifespan_aware
async def streamed(scope: Any, receive: Receive, send: Send) -> None:
    """Answers three parts without a length."""
    await read_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for part in (b"one", b"two", b"three"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


CLOSE = b"connection: close\r\n"


def get(path: str, *extra: bytes) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: t\r\n".encode() + b"".join(extra) + b"\r\n"


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n".encode()
    return head + b"".join(extra) + b"\r\n" + body


# -- answers -------------------------------------------------------------------------------


async def test_an_answer_with_a_length_keeps_the_connection_and_carries_a_date() -> None:
    async with served(echo) as server:
        raw = await exchange(server.port, post("/a", b"hi") + get("/b", CLOSE))

    first, second = raw.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.endswith(b"\r\n\r\nPOST /a hi")
    assert b"connection" not in first and b"date: " in first
    assert b"connection: close\r\n" in second and second.endswith(b"GET /b ")


async def test_an_answer_without_a_length_is_chunked() -> None:
    async with served(streamed) as server:
        raw = await exchange(server.port, get("/", CLOSE))

    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n"


async def test_http_1_0_answer_without_a_length_ends_with_the_connection() -> None:
    async with served(streamed) as server:
        raw = await exchange(server.port, b"GET / HTTP/1.0\r\n\r\n")

    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"chunked" not in head and b"connection: close" in head
    assert body == b"onetwothree"


async def test_a_head_request_gets_the_head_alone() -> None:
    async with served(echo) as server:
        raw = await exchange(server.port, b"HEAD /x HTTP/1.1\r\nhost: t\r\n" + CLOSE + b"\r\n")

    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\n")
    assert b"content-length: 8\r\n" in raw  # the length of "HEAD /x ", not sent


# -- requests ------------------------------------------------------------------------------


async def test_pipelined_requests_are_served_one_at_a_time_in_order() -> None:
    serving = 0
    most = 0

    @lifespan_aware
    async def counted(scope: Any, receive: Receive, send: Send) -> None:
        nonlocal serving, most
        serving += 1
        most = max(most, serving)
        await asyncio.sleep(0)  # lets a wrongly concurrent second request start
        serving -= 1
        await echo(scope, receive, send)

    requests = post("/1", b"a") + post("/2", b"bb") + post("/3", b"", CLOSE)
    async with served(counted) as server:
        raw = await exchange(server.port, requests)

    assert raw.count(b"HTTP/1.1 200 OK") == 3
    assert raw.index(b"POST /1 a") < raw.index(b"POST /2 bb") < raw.index(b"POST /3 ")
    assert most == 1


async def test_a_request_refused_behind_one_being_served_is_refused_after_its_answer() -> None:
    async with served(echo) as server:
        raw = await exchange(server.port, get("/first") + b"GARBAGE\r\n\r\n")

    first, refusal = raw.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK") and first.endswith(b"GET /first ")
    assert refusal.startswith(b"400 ") and b"malformed HTTP request" in refusal


async def split_at(port: int, stream: bytes, cuts: list[int]) -> bytes:
    """Send ``stream`` on a new connection in pieces cut at ``cuts``, each read by the server
    on its own, and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        start = 0
        for cut in [*cuts, len(stream)]:
            writer.write(stream[start:cut])
            await writer.drain()
            await asyncio.sleep(0)  # lets the server read each piece on its own
            start = cut
        async with asyncio.timeout(WAIT):
            return await reader.read()
    finally:
        writer.close()


async def assert_answered_alike_split_anywhere(stream: bytes, answers: list[bytes]) -> None:
    """``stream`` gets ``answers`` (their bodies, each a 200), and the same however it is cut:
    at every single point, and in one-byte pieces through its first 90 bytes."""
    async with served(echo) as server:
        whole = await split_at(server.port, stream, [])
        pieces = [await split_at(server.port, stream, [cut]) for cut in range(1, len(stream))]
        pieces.append(await split_at(server.port, stream, list(range(1, 90))))

    got = [part.split(b"\r\n\r\n", 1)[1] for part in whole.split(b"HTTP/1.1 200 OK")[1:]]
    assert got == answers
    strip = _without_dates
    assert all(strip(piece) == strip(whole) for piece in pieces)


CHUNKED = (
    b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n{upgrade}\r\n"
    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
)


async def test_requests_split_anywhere_are_answered_as_if_sent_whole() -> None:
    chunked = CHUNKED.replace(b"{upgrade}", b"")
    stream = post("/1", b"hello") + chunked + get("/2") + post("/3", b"x", CLOSE)

    answers = [b"POST /1 hello", b"POST /c abcde", b"GET /2 ", b"POST /3 x"]
    await assert_answered_alike_split_anywhere(stream, answers)


async def test_an_upgrade_is_not_taken_the_request_is_served_body_and_all_and_the_next_read() -> (
    None
):
    # llhttp stops at the end of an upgrade's head: its body used to be lost (and the
    # connection closed after the answer); what follows the body is read as HTTP/1.1.
    h2c = [b"connection: Upgrade, HTTP2-Settings\r\n", b"upgrade: h2c\r\n"]
    h2c.append(b"http2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")
    websocket = [b"connection: upgrade\r\n", b"upgrade: websocket\r\n"]
    chunked = CHUNKED.replace(b"{upgrade}", b"".join(websocket))
    stream = post("/1", b"hello", *h2c) + chunked + get("/2", *h2c) + post("/3", b"x", CLOSE)

    answers = [b"POST /1 hello", b"POST /c abcde", b"GET /2 ", b"POST /3 x"]
    await assert_answered_alike_split_anywhere(stream, answers)


async def test_a_malformed_chunked_body_behind_a_request_served_is_refused_after_it() -> None:
    # It used to wait behind that answer, then be served with a body that never ends.
    broken = CHUNKED.replace(b"{upgrade}", b"").replace(b"2\r\nde", b"zz\r\nde")
    async with served(echo) as server:
        raw = await exchange(server.port, get("/first") + broken)

    first, refusal = raw.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK") and first.endswith(b"GET /first ")
    assert refusal.startswith(b"400 ") and b"connection: close" in refusal
    assert b"chunked framing is malformed" in refusal


def _without_dates(raw: bytes) -> bytes:
    return b"".join(line for line in raw.splitlines(keepends=True) if not line.startswith(b"date:"))


async def test_a_chunked_body_arrives_decoded() -> None:
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    head = b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n" + CLOSE + b"\r\n"
    async with served(echo) as server:
        raw = await exchange(server.port, head + body)

    assert raw.endswith(b"POST /c hello world")


async def test_expect_continue_is_answered_when_the_app_reads_the_body() -> None:
    async with served(echo) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nexpect: 100-continue\r\n"
        writer.write(head + CLOSE + b"\r\n")
        async with asyncio.timeout(WAIT):
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"ok")
            rest = await reader.read()
        writer.close()

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert rest.startswith(b"HTTP/1.1 200 OK") and rest.endswith(b"POST /e ok")


async def test_a_percent_encoded_path_is_decoded_and_its_raw_form_kept() -> None:
    seen: list[tuple[str, bytes, bytes]] = []

    @lifespan_aware
    async def paths(scope: Any, receive: Receive, send: Send) -> None:
        seen.append((scope["path"], scope["raw_path"], scope["query_string"]))
        await echo(scope, receive, send)

    async with served(paths) as server:
        await exchange(server.port, get("/a%20b?x=1", CLOSE))

    assert seen == [("/a b", b"/a%20b", b"x=1")]


# -- the client and the app failing --------------------------------------------------------


async def test_the_app_hears_the_client_go_and_its_later_sends_do_nothing() -> None:
    gone = asyncio.Event()
    sent_after = asyncio.Event()

    @lifespan_aware
    async def waits(scope: Any, receive: Receive, send: Send) -> None:
        await read_body(receive)
        assert (await receive())["type"] == "http.disconnect"
        gone.set()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})
        sent_after.set()

    async with served(waits) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/w", b"x"))
        await writer.drain()
        writer.close()
        async with asyncio.timeout(WAIT):
            await gone.wait()
            await sent_after.wait()


async def test_an_app_failing_before_its_answer_gives_a_500_in_the_api_shape() -> None:
    @lifespan_aware
    async def fails(scope: Any, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async with served(fails) as server:
        raw = await exchange(server.port, get("/v1/messages"))

    assert raw.startswith(b"HTTP/1.1 500 ")
    assert b"connection: close" in raw and b'"type":"error"' in raw.replace(b" ", b"")
    assert b"boom" not in raw


@pytest.mark.parametrize("value", [b"v\r\nx-evil: 1", b"v\nx-evil: 1", b"v\x00"])
async def test_a_header_that_would_split_the_answer_is_never_written(value: bytes) -> None:
    @lifespan_aware
    async def splits(scope: Any, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"2"), (b"x-note", value)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    async with served(splits) as server:
        raw = await exchange(server.port, get("/"))

    assert raw.startswith(b"HTTP/1.1 500 ") and b"x-evil" not in raw and b"x-note" not in raw


async def test_an_answer_the_app_leaves_unfinished_closes_the_connection() -> None:
    @lifespan_aware
    async def stops(scope: Any, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})

    async with served(stops) as server:
        raw = await exchange(server.port, get("/"))  # returns: the server closed it

    assert raw.endswith(b"4\r\npart\r\n")  # no last chunk: the client sees it cut short


async def test_a_client_that_does_not_read_holds_a_streaming_app_back() -> None:
    part = b"x" * (256 * 1024)
    parts = 64  # 16 MiB: more than the transport's buffer and both sockets' hold
    sent = 0
    finished = asyncio.Event()

    @lifespan_aware
    async def floods(scope: Any, receive: Receive, send: Send) -> None:
        nonlocal sent
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(parts):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            sent += 1
        await send({"type": "http.response.body", "body": b""})
        finished.set()

    async with served(floods) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/", CLOSE))
        for _ in range(200):  # turns of the loop for the app to run as far as it may
            await asyncio.sleep(0)
        held_at = sent
        async with asyncio.timeout(WAIT):
            raw = await reader.read()  # now the client reads: the app goes on to the end
            await finished.wait()
        writer.close()

    assert 0 < held_at < parts  # waited on the client, not buffered whole
    assert raw.count(part) == parts and raw.endswith(b"0\r\n\r\n")


# -- connections ---------------------------------------------------------------------------


async def test_an_idle_connection_closes_after_the_keep_alive_time() -> None:
    async with served(echo, keep_alive_timeout=0.05) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/"))
        async with asyncio.timeout(WAIT):  # the idle check runs once a second
            raw = await reader.read()
        writer.close()

    assert raw.count(b"HTTP/1.1 200 OK") == 1


async def test_a_stop_finishes_the_answer_under_way_and_closes_idle_connections() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @lifespan_aware
    async def slow(scope: Any, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            started.set()
            await release.wait()
        await echo(scope, receive, send)

    async with served(slow) as server:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
        idle_writer.write(get("/idle"))
        async with asyncio.timeout(WAIT):
            await idle_reader.readuntil(b"GET /idle ")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/slow"))
        async with asyncio.timeout(WAIT):
            await started.wait()
            server.shutdown.set()
            assert await idle_reader.read() == b""  # the idle one closes at once
            assert not server.task.done()
            release.set()
            answer = await reader.read()
            await server.task
        idle_writer.close()
        writer.close()

    assert answer.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in answer
    assert answer.endswith(b"GET /slow ")
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)


async def test_a_stop_cuts_an_answer_still_going_after_the_grace_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Cut silently, a stop that ended streams looked like one that drained them.
    monkeypatch.setattr(h1_server, "GRACE_SECONDS", 0.05)
    started = asyncio.Event()

    @lifespan_aware
    async def endless(scope: Any, receive: Receive, send: Send) -> None:
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        started.set()
        while True:
            await send({"type": "http.response.body", "body": b"more", "more_body": True})
            await asyncio.sleep(0.01)

    async with served(endless) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/stream"))
        async with asyncio.timeout(WAIT):
            await started.wait()
            server.shutdown.set()
            await server.task
            answer = await reader.read()
        writer.close()

    assert answer.startswith(b"HTTP/1.1 200 OK") and not answer.endswith(b"0\r\n\r\n")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "stopping: 1 connection(s) still answering after the 0.05 s grace closed (their "
        "answers are cut short)"
    ]


# -- HTTP/2 (prior knowledge), handed to Hypercorn's protocol -------------------------------


def h2_client(port: int) -> httpx.AsyncClient:
    """An HTTP/2-only client (h2c with prior knowledge) on ``port``."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", http1=False, http2=True)


async def test_http2_requests_are_served_multiplexed_on_one_connection() -> None:
    arrived: list[str] = []
    all_in = asyncio.Event()

    @lifespan_aware
    async def gathering(scope: Any, receive: Receive, send: Send) -> None:
        # Each answer waits for all five requests: only one connection carrying five streams
        # at once answers at all.
        arrived.append(scope["http_version"])
        if len(arrived) == 5:
            all_in.set()
        await all_in.wait()
        await echo(scope, receive, send)

    async with served(gathering) as server, h2_client(server.port) as client:
        async with asyncio.timeout(WAIT):
            answers = await asyncio.gather(
                *(client.post(f"/n{i}", content=b"x" * i) for i in range(5))
            )

    assert [a.http_version for a in answers] == ["HTTP/2"] * 5
    assert [a.text for a in answers] == [f"POST /n{i} " + "x" * i for i in range(5)]
    assert arrived == ["2"] * 5


async def test_a_preface_arriving_in_pieces_is_still_http2() -> None:
    async with served(echo) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for piece in (PREFACE[:3], PREFACE[3:10], PREFACE[10:]):
            writer.write(piece)
            await writer.drain()
        async with asyncio.timeout(WAIT):
            frame_head = await reader.readexactly(9)
        writer.close()

    assert frame_head[3] == 0x4  # the server's SETTINGS frame opens its HTTP/2 side


async def test_a_preface_that_stalls_is_refused_like_a_stalled_head() -> None:
    async with served(echo, header_timeout=0.2) as server:
        raw = await exchange(server.port, PREFACE[:5])  # also the start of a method "PRI"

    assert raw.startswith(b"HTTP/1.1 408 ")


async def test_http2_like_bytes_that_are_not_the_preface_are_refused_as_http1() -> None:
    async with served(echo) as server:
        raw = await exchange(server.port, b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")

    assert raw.startswith(b"HTTP/1.1 400 ")  # llhttp: not a request line it can frame


@pytest.mark.parametrize("listens", [True, False], ids=["hears-the-close", "deaf"])
async def test_a_stop_awaits_the_calls_it_cut_before_the_apps_shutdown(
    monkeypatch: pytest.MonkeyPatch, listens: bool
) -> None:
    # A call still running past the grace (an answer cut, a client gone) went on after the
    # server's stop: the app's shutdown ran first, and what the call then recorded (its
    # request-log row) reached an outbox already stopped. One that hears its connection
    # close ends by itself (a call settling a written answer is never cut short); one that
    # does not is cancelled after a bound.
    monkeypatch.setattr(h1_server, "GRACE_SECONDS", 0.05)
    monkeypatch.setattr(h1_server, "_CALLS_END_SECONDS", 0.2)
    started = asyncio.Event()
    seen: list[str] = []

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            seen.append("shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return
        try:
            await read_body(receive)
            started.set()
            if listens:
                assert (await receive())["type"] == "http.disconnect"
                seen.append("heard the close")
            else:
                await asyncio.Event().wait()  # an upstream that never answers
        finally:
            seen.append("call ended")

    async with served(app) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/hangs"))
        async with asyncio.timeout(WAIT):
            await started.wait()
            server.shutdown.set()
            await server.task
        writer.close()

    assert seen == [*(["heard the close"] if listens else []), "call ended", "shutdown"]


async def test_a_stop_finishes_the_http2_stream_under_way_then_closes() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @lifespan_aware
    async def slow(scope: Any, receive: Receive, send: Send) -> None:
        started.set()
        await release.wait()
        await echo(scope, receive, send)

    async with served(slow) as server, h2_client(server.port) as client:
        pending = asyncio.create_task(client.get("/slow"))
        async with asyncio.timeout(WAIT):
            await started.wait()
            server.shutdown.set()
            await asyncio.sleep(0)  # the stop has begun: the stream under way is not cut
            assert not server.task.done()
            release.set()
            answer = await pending
            await server.task

    assert answer.status_code == 200 and answer.text == "GET /slow "


@pytest.mark.parametrize("after", [b"", SETTINGS, JUNK_FRAMES], ids=["nothing", "settings", "junk"])
async def test_an_http2_connection_that_opens_no_stream_closes_after_the_keep_alive_time(
    after: bytes,
) -> None:
    async with served(echo, keep_alive_timeout=0.2) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(PREFACE + after)
        async with asyncio.timeout(WAIT):  # held open for good, before
            raw = await reader.read()
        writer.close()

    assert raw[3] == 0x4  # it was HTTP/2: the server's SETTINGS frame came first
