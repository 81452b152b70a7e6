"""The HTTP server's edge, through raw sockets (an SDK cannot send these): ambiguous framing
(request smuggling, a repeated or listed Content-Length, obs-fold, bare LF), unknown HTTP
versions and lower-case methods are refused and the connection closed; a head or a body that
is too large or never arrives is answered promptly; the
server's own errors come in the caller's API shape with an ``x-request-id``; and a keep-alive
connection the client closes is closed on the server's side at once.

Runs on ``inproc://`` only: nothing here crosses the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from schemas import RequestCompleted, subjects
from schemas.config import ServerConfig
from tests.e2e.conftest import CHAT, WAIT, assert_openai_error, config, model, route, watch
from tests.fixtures.gateway import RunningGateway, start_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

LIMIT = 4096
BODY_TIMEOUT = 0.3  # seconds; the stalled-body tests wait this long for their answer
HEADER_TIMEOUT = 0.3  # seconds; the stalled-head tests wait this long for their answer
MESSAGES = "/v1/messages"
CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
# Defences Hypercorn's edge (gateway/ingress/http_edge.py) and the builtin engine
# (gateway/process/h1) give; granian's parser (hyper) acts before the ASGI app and cannot be
# hooked. Each test so marked says what granian does instead; the README lists these.
EDGE_DEFENCES = pytest.mark.parametrize("engine", ["hypercorn", "builtin"], indirect=True)


@pytest.fixture
async def gw(
    fake_upstream: FakeUpstream, tmp_path: Path, engine: str
) -> AsyncIterator[RunningGateway]:
    """A gateway on ``engine`` with model ``m``, a small body limit and short head and body
    timeouts."""
    running = await start_gateway(
        config(
            model("m", route(fake_upstream)),
            server={
                "engine": engine,
                "max_body_bytes": LIMIT,
                "body_timeout_seconds": BODY_TIMEOUT,
                "header_timeout_seconds": HEADER_TIMEOUT,
            },
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


@contextlib.asynccontextmanager
async def connection(
    gw: RunningGateway, data: bytes
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw connection to ``gw`` that has sent ``data``; closed on every path (a socket
    left open would fail a later test that counts them)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
    try:
        writer.write(data)
        await writer.drain()
        yield reader, writer
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def answered_before_body(
    gw: RunningGateway, path: str, content_length: int
) -> AsyncIterator[tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection that has sent the head of a JSON ``POST path`` declaring
    ``content_length`` bytes of body (none of them yet) and read the head of its answer:
    yields that answer head and the connection."""
    request_head = (
        f"POST {path} HTTP/1.1\r\nhost: llmgw\r\ncontent-type: application/json\r\n"
        f"content-length: {content_length}\r\n\r\n"
    )
    async with connection(gw, request_head.encode()) as (reader, writer):
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
        yield head, reader, writer


async def converse(gw: RunningGateway, data: bytes) -> list[Answer]:
    """Send ``data`` on one connection and read until the gateway closes it; every answer."""
    async with connection(gw, data) as (reader, _):
        async with asyncio.timeout(WAIT):  # a gateway that keeps the connection fails here
            raw = await reader.read()
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


def smuggling(path: str, framing: list[bytes]) -> bytes:
    """A request framed by both headers, its chunked body empty, with a second request
    hidden where a front end trusting Content-Length would see body."""
    hidden = b"GET /health HTTP/1.1\r\nhost: llmgw\r\n\r\n"
    body = b"0\r\n\r\n" + hidden
    headers = b"".join(h.replace(b"{n}", str(len(body)).encode()) + b"\r\n" for h in framing)
    return f"POST {path} HTTP/1.1\r\nhost: llmgw\r\n".encode() + headers + b"\r\n" + body


LAST = b"GET /health HTTP/1.1\r\nhost: llmgw\r\nconnection: close\r\n\r\n"
CL_TE = [b"content-length: {n}", b"transfer-encoding: chunked"]
TE_CL = [b"Transfer-Encoding: chunked", b"Content-Length: {n}"]


# -- framing, versions, methods ------------------------------------------------------------


# granian: hyper drops the Content-Length, reads the body as chunked and closes the
# connection after answering (no smuggled request is read, but no 400 either).
@EDGE_DEFENCES
@pytest.mark.parametrize("framing", [CL_TE, TE_CL], ids=["cl-te", "te-cl"])
async def test_content_length_with_chunked_is_400_and_the_hidden_request_gets_no_answer(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    framing: list[bytes],
) -> None:
    answers = await converse(gw, smuggling(CHAT, framing))

    err = assert_refused(answers, 400)
    assert "Transfer-Encoding" in err["message"] and "Content-Length" in err["message"]
    assert err["code"] == "invalid_request"
    assert fake_upstream.requests == []


# What granian does instead (the defence that matters holds): the body is read as chunked
# (here empty, so the app refuses it), the connection closes, the hidden request is never read.
@pytest.mark.parametrize("engine", ["granian"], indirect=True)
@pytest.mark.parametrize("framing", [CL_TE, TE_CL], ids=["cl-te", "te-cl"])
async def test_granian_reads_content_length_with_chunked_as_chunked_and_answers_once(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    framing: list[bytes],
) -> None:
    answers = await converse(gw, smuggling(CHAT, framing))

    assert [a.status_code for a in answers] == [400]
    assert answers[0].headers["connection"] == "close"
    assert fake_upstream.requests == []


# granian: as above, hyper reads it as chunked and closes; it is not refused.
@EDGE_DEFENCES
async def test_smuggling_on_messages_is_refused_in_anthropic_shape(gw: RunningGateway) -> None:
    answers = await converse(gw, smuggling(MESSAGES, CL_TE))

    assert "Transfer-Encoding" in assert_anthropic_refusal(answers, 400)


def chat_request(headers: list[bytes], eol: bytes = b"\r\n") -> bytes:
    """A whole chat request with ``headers`` (``{n}``: the body's length) after the host."""
    lines = [f"POST {CHAT} HTTP/1.1".encode(), b"host: llmgw", b"content-type: application/json"]
    lines += [h.replace(b"{n}", str(len(CHAT_BODY)).encode()) for h in headers]
    return eol.join([*lines, b"", b""]) + CHAT_BODY


LENIENT_FRAMING = {
    # what h11 would read one way (and serve) where another parser may read another
    "content-length-twice": (
        chat_request([b"content-length: {n}", b"Content-Length: {n}"]),
        "Content-Length must be given once",
    ),
    "content-length-list": (
        chat_request([b"content-length: {n}, {n}"]),
        "Content-Length must be given once",
    ),
    "obs-fold": (
        chat_request([b"content-length: {n}", b"x-note: first", b" continued"]),
        "obs-fold",
    ),
    "obs-fold-in-content-length": (
        chat_request([b"content-length:", b"\t{n}"]),
        "obs-fold",
    ),
    "bare-lf": (chat_request([b"content-length: {n}"], eol=b"\n"), "bare LF"),
    "one-bare-lf": (
        chat_request([b"content-length: {n}\nx-note: smuggled"]),
        "bare LF",
    ),
}


# granian: hyper refuses a Content-Length list and obs-fold with a bodiless 400, merges
# a Content-Length repeated with one value (RFC 9112 allows it) and accepts a bare LF.
@EDGE_DEFENCES
@pytest.mark.parametrize("case", list(LENIENT_FRAMING))
async def test_leniently_framed_head_is_400_and_never_served(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    case: str,
) -> None:
    data, words = LENIENT_FRAMING[case]
    served = chat_request([b"content-length: {n}"])  # the same request, framed plainly

    answers = await converse(gw, data)

    err = assert_refused(answers, 400)
    assert words in err["message"] and err["code"] == "invalid_request"
    assert fake_upstream.requests == []
    assert [a.status_code for a in await converse(gw, served + LAST)] == [200, 200]


# granian: hyper refuses both with a bodiless 400 of its own.
@EDGE_DEFENCES
@pytest.mark.parametrize(
    "codings",
    [[b"transfer-encoding: chunked, chunked"], [b"transfer-encoding: chunked"] * 2],
    ids=["listed-twice", "two-fields"],
)
async def test_chunked_applied_twice_is_400_not_an_unknown_coding(
    gw: RunningGateway, fake_upstream: FakeUpstream, codings: list[bytes]
) -> None:
    # It was a 501 (an unknown coding, server_error's type with invalid_request's code): a
    # sender must not apply chunked twice (RFC 9112 6.1), so the request is malformed.
    head = f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\n".encode() + b"\r\n".join(codings)
    answers = await converse(gw, head + b"\r\n\r\n" + chunked(CHAT_BODY))

    err = assert_refused(answers, 400)
    assert err["code"] == "invalid_request" and err["type"] == "invalid_request_error"
    assert fake_upstream.requests == []


@EDGE_DEFENCES
async def test_a_coding_other_than_chunked_is_501(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    head = f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\ntransfer-encoding: gzip, chunked\r\n"
    answers = await converse(gw, head.encode() + b"\r\n" + chunked(CHAT_BODY))

    assert "chunked" in assert_refused(answers, 501)["message"]
    assert fake_upstream.requests == []


# granian: hyper's refusal is a bodiless 400, not in the caller's API shape.
@EDGE_DEFENCES
async def test_leniently_framed_head_on_messages_is_refused_in_anthropic_shape(
    gw: RunningGateway,
) -> None:
    data = f"POST {MESSAGES} HTTP/1.1\r\nhost: llmgw\r\ncontent-length: 2, 2\r\n\r\n{{}}"

    assert "Content-Length" in assert_anthropic_refusal(await converse(gw, data.encode()), 400)


# granian: hyper refuses an unknown version with a bodiless 400 (not 505 in the API shape).
@EDGE_DEFENCES
@pytest.mark.parametrize(
    ("request_line", "words"),
    [(b"GET /health HTTP/9.9", "HTTP/9.9"), (b"GET /health HTTP/2.0", "HTTP/2.0")],
    ids=["http-9.9", "http-2.0-without-preface"],
)
async def test_unknown_version_is_refused(
    gw: RunningGateway, request_line: bytes, words: str
) -> None:
    answers = await converse(gw, request_line + b"\r\nhost: llmgw\r\n\r\n")

    assert words in assert_refused(answers, 505)["message"]


@pytest.mark.parametrize(
    "request_line",
    [b"get /health HTTP/1.1", b"Post /v1/chat/completions HTTP/1.1"],
    ids=["get-lower", "post-mixed"],
)
async def test_lower_case_method_is_refused(gw: RunningGateway, request_line: bytes) -> None:
    answers = await converse(gw, request_line + b"\r\nhost: llmgw\r\n\r\n")

    assert "upper-case" in assert_refused(answers, 400)["message"]


# granian: a raw byte in the target gets hyper's bodiless 400, not in the caller's API shape.
@EDGE_DEFENCES
@pytest.mark.parametrize(
    "request_line",
    [b"post /v1/messages HTTP/1.1", b"POST /v1/messages?a=\xff HTTP/1.1"],
    ids=["lower-case-method", "raw-byte-in-target"],
)
async def test_a_request_line_refused_on_messages_is_answered_in_anthropic_shape(
    gw: RunningGateway, request_line: bytes
) -> None:
    # Before: OpenAI's shape, the target not yet read when the parser stopped (a fuzzer).
    answers = await converse(gw, request_line + b"\r\nhost: llmgw\r\n\r\n")

    assert assert_anthropic_refusal(answers, 400)


async def test_lower_case_method_is_refused_not_upgraded_to_h2c(gw: RunningGateway) -> None:
    upgrade = (
        b"get /health HTTP/1.1\r\nhost: llmgw\r\nconnection: Upgrade, HTTP2-Settings\r\n"
        b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
    )

    assert "upper-case" in assert_refused(await converse(gw, upgrade), 400)["message"]


async def test_http2_with_prior_knowledge_is_still_spoken(gw: RunningGateway) -> None:
    async with connection(gw, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") as (reader, _):
        async with asyncio.timeout(WAIT):
            frame_head = await reader.readexactly(9)

    assert frame_head[3] == 0x4  # the server's SETTINGS frame opens its HTTP/2 side


async def test_http_1_0_and_upper_case_methods_are_still_served(gw: RunningGateway) -> None:
    answers = await converse(gw, b"GET /health HTTP/1.0\r\nhost: llmgw\r\n\r\n")

    assert [a.status_code for a in answers] == [200]
    assert answers[0].json()["status"] == "ok"


async def test_keep_alive_requests_on_one_connection_are_still_served(
    gw: RunningGateway,
) -> None:
    one = (
        f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\ncontent-type: application/json\r\n"
        f"content-length: {len(CHAT_BODY)}\r\n\r\n"
    ).encode() + CHAT_BODY
    last = b"GET /health HTTP/1.1\r\nhost: llmgw\r\nconnection: close\r\n\r\n"

    answers = await converse(gw, one + one + last)

    assert [a.status_code for a in answers] == [200, 200, 200]


UPGRADES = {
    # curl --http2 on a plain-HTTP URL; a WebSocket handshake's headers; a protocol unknown
    "h2c": [
        b"connection: Upgrade, HTTP2-Settings",
        b"upgrade: h2c",
        b"http2-settings: AAMAAABkAAQCAAAAAAIAAAAA",
    ],
    "websocket": [b"connection: Upgrade", b"upgrade: websocket", b"sec-websocket-version: 13"],
    "foo": [b"connection: upgrade", b"upgrade: foo"],
}


def chunked(body: bytes) -> bytes:
    """``body`` in the chunked coding, in two chunks."""
    half = len(body) // 2
    return b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])


def chat_upgrade_request(upgrade: str, framing: str) -> bytes:
    """The chat request, asking to upgrade to ``upgrade``, its body framed by ``framing``."""
    if framing == "chunked":
        request = chat_request([b"transfer-encoding: chunked", *UPGRADES[upgrade]])
        return request.removesuffix(CHAT_BODY) + chunked(CHAT_BODY)
    return chat_request([b"content-length: {n}", *UPGRADES[upgrade]])


# Hypercorn takes an h2c upgrade (101, then HTTP/2), and h11 reads nothing as HTTP/1.1 after
# a request asking to upgrade (its answer closes the connection): the builtin engine and
# granian answer the request in HTTP/1.1, ignoring the upgrade (RFC 9110 §7.8).
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_a_request_asking_to_upgrade_is_served_over_http_1_1_body_and_all(
    gw: RunningGateway, fake_upstream: FakeUpstream, upgrade: str, framing: str
) -> None:
    # The builtin engine used to drop its body (llhttp stops at the end of an upgrade's
    # head): a 400 "the request body is not valid JSON" where the same request without the
    # header was served, and the connection closed. Now every engine serves it and reads on.
    answers = await converse(gw, chat_upgrade_request(upgrade, framing) + LAST)

    assert [a.status_code for a in answers] == [200, 200], answers
    assert answers[0].json()["object"] == "chat.completion"
    assert answers[1].json()["status"] == "ok"  # the request after it, read as HTTP/1.1
    sent = json.loads(CHAT_BODY)["messages"]
    assert [r.json["messages"] for r in fake_upstream.requests] == [sent]


# -- the server's own errors ---------------------------------------------------------------


# granian: hyper answers an oversized head with a bodiless 431, not in the API shape.
@EDGE_DEFENCES
async def test_headers_too_large_on_messages_is_431_in_anthropic_shape(
    gw: RunningGateway,
) -> None:
    big = b"x-padding: " + b"a" * 20_000 + b"\r\n"
    answers = await converse(gw, f"POST {MESSAGES} HTTP/1.1\r\nhost: llmgw\r\n".encode() + big)

    assert [a.status_code for a in answers] == [431], answers
    assert answers[0].headers["x-request-id"]
    assert answers[0].json()["type"] == "error"


# granian: hyper's parse errors are bodiless 400s, not in the API shape.
@EDGE_DEFENCES
async def test_malformed_header_is_400_in_openai_shape(gw: RunningGateway) -> None:
    answers = await converse(
        gw, f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\nno colon here\r\n\r\n".encode()
    )

    assert_refused(answers, 400)


# granian: hyper's parse errors are bodiless 400s, not in the API shape.
@EDGE_DEFENCES
async def test_garbage_instead_of_a_request_is_400_in_openai_shape(gw: RunningGateway) -> None:
    assert_refused(await converse(gw, b"\x16\x03\x01 not http at all\r\n\r\n"), 400)


# -- heads ---------------------------------------------------------------------------------


def test_header_timeout_defaults_to_10_seconds() -> None:
    assert ServerConfig().header_timeout_seconds == 10


# granian: hyper's header_read_timeout closes a stalled head's connection without an
# answer (no 408); the head timeout still bounds it.
@EDGE_DEFENCES
@pytest.mark.parametrize(
    "stalled",
    [b"POST /v1/chat/completions HTTP/1.1\r\nhost: llmgw\r\n", b"GET /hea"],
    ids=["headers-never-end", "request-line-never-ends"],
)
async def test_stalled_head_is_408_and_the_connection_closes(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    stalled: bytes,
) -> None:
    answers = await converse(gw, stalled)  # the keep-alive timeout (75 s) is past its WAIT

    err = assert_refused(answers, 408)
    assert err["code"] == "request_timeout"
    assert f"{HEADER_TIMEOUT:g} seconds" in err["message"]
    assert fake_upstream.requests == []


# granian: no 408 for a stalled head (see above).
@EDGE_DEFENCES
async def test_stalled_head_on_messages_is_408_in_anthropic_shape(gw: RunningGateway) -> None:
    answers = await converse(gw, f"POST {MESSAGES} HTTP/1.1\r\nhost: llmgw\r\n".encode())

    assert [a.status_code for a in answers] == [408], answers
    assert answers[0].json()["error"]["type"] == "timeout_error"


# granian: no 408 for a stalled head (see above).
@EDGE_DEFENCES
async def test_stalled_pipelined_head_after_an_answer_is_408(gw: RunningGateway) -> None:
    health = b"GET /health HTTP/1.1\r\nhost: llmgw\r\n\r\n"

    answers = await converse(gw, health + b"GET /health HTTP/1.1\r\nhost: ll")

    assert [a.status_code for a in answers] == [200, 408], answers


async def test_an_answer_given_before_its_body_was_read_says_the_connection_closes(
    gw: RunningGateway,
) -> None:
    # An unknown path is answered before its body is read, and the server closes such a
    # connection once the answer is out. The answer used to say nothing of it, so a client
    # sent its next request on the closing connection and met "server disconnected without
    # sending a response" (two in 20,000 requests of a scanner's mix, on both engines).
    unknown = f"{MESSAGES}/unknown"
    async with answered_before_body(gw, unknown, len(CHAT_BODY)) as (head, reader, writer):
        writer.write(CHAT_BODY)  # the body, once its answer has come
        await writer.drain()
        async with asyncio.timeout(WAIT):  # the rest of the answer, then the close
            raw = head + await reader.read()

    (answer,) = parse_answers(raw)
    assert answer.status_code == 404
    assert answer.headers["connection"] == "close"
    assert answer.json()["type"] == "error"


async def test_a_refused_method_answered_before_its_body_says_the_connection_closes(
    gw: RunningGateway,
) -> None:
    # A method the path does not serve is answered before the body is read, like an
    # unknown path (and a refused key).
    (answer,) = await converse(
        gw,
        f"PUT {CHAT} HTTP/1.1\r\nhost: llmgw\r\ncontent-type: application/json\r\n"
        f"content-length: {len(CHAT_BODY)}\r\n\r\n".encode()
        + CHAT_BODY,
    )
    assert answer.status_code == 405 and answer.headers["connection"] == "close"


async def test_answers_to_bodiless_requests_keep_the_connection(gw: RunningGateway) -> None:
    missing = b"GET /v1/models/none HTTP/1.1\r\nhost: llmgw\r\n\r\n"

    answers = await converse(gw, missing + missing + LAST)

    assert [a.status_code for a in answers] == [404, 404, 200]
    assert "connection" not in answers[0].headers


# -- bodies --------------------------------------------------------------------------------


def test_body_timeout_defaults_to_30_seconds() -> None:
    assert ServerConfig().body_timeout_seconds == 30


async def test_declared_10_gb_body_is_413_before_a_byte_of_it_is_sent(
    gw: RunningGateway,
) -> None:
    async with answered_before_body(gw, CHAT, 10 * 1024**3) as (head, reader, _):
        (answer,) = parse_answers(head)  # the head alone: its body is still to come
        async with asyncio.timeout(WAIT):
            body = await reader.readexactly(int(answer.headers["content-length"]))
            rest = await reader.read()  # then the gateway closes the connection

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


# granian: hyper ends the exchange itself when its client goes away mid-body; the app sees
# no request to log.
@EDGE_DEFENCES
@pytest.mark.parametrize(
    "cut",
    [
        b"transfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n" % (len(CHAT_BODY), CHAT_BODY),
        b'content-length: 100\r\n\r\n{"model": ',
    ],
    ids=["chunked-after-a-whole-json-chunk", "short-content-length"],
)
async def test_a_body_cut_short_by_the_client_leaving_is_logged_as_cancelled(
    gw: RunningGateway, fake_upstream: FakeUpstream, cut: bytes
) -> None:
    # It was logged as the client's malformed request: a 400 invalid_request.
    async with watch(gw, subjects.request_done("")) as done:
        async with connection(gw, f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\n".encode() + cut):
            pass  # the client leaves as soon as it has sent this much
        completed = await done.next(RequestCompleted)

    assert (completed.status, completed.error_kind) == (499, "cancelled")
    assert fake_upstream.requests == []


MALFORMED_CHUNKS = {
    "size-not-hex": b"zz\r\nabc\r\n0\r\n\r\n",
    "data-longer-than-its-size": b"2\r\nabc\r\n0\r\n\r\n",
    "after-a-whole-json-chunk": b"%x\r\n%b\r\nzz\r\n" % (len(CHAT_BODY), CHAT_BODY),
    "size-over-64-bits": b"ffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
}


def chunked_chat(chunks: bytes) -> bytes:
    head = f"POST {CHAT} HTTP/1.1\r\nhost: llmgw\r\ncontent-type: application/json\r\n"
    return head.encode() + b"transfer-encoding: chunked\r\n\r\n" + chunks


# granian: hyper's refusal is a bodiless 400 without "connection: close", and a malformed
# chunk after a whole JSON chunk ends the body there: that request is served (hyper sits
# before the app and cannot be hooked).
@EDGE_DEFENCES
@pytest.mark.parametrize("chunks", list(MALFORMED_CHUNKS)[:3])
async def test_malformed_chunked_body_is_400_at_once_and_the_connection_closes(
    gw: RunningGateway, fake_upstream: FakeUpstream, chunks: str
) -> None:
    # The builtin engine used to give no answer until the body timeout, then a 408.
    answers = await converse(gw, chunked_chat(MALFORMED_CHUNKS[chunks]))

    err = assert_refused(answers, 400)
    assert err["code"] == "invalid_request"
    assert fake_upstream.requests == []


# Hypercorn: h11 takes a chunk size of any length (it then waits for that many bytes and
# the body timeout answers 408); granian: as above.
@pytest.mark.parametrize("engine", ["builtin"], indirect=True)
async def test_chunk_size_over_64_bits_is_400_at_once_and_the_connection_closes(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    answers = await converse(gw, chunked_chat(MALFORMED_CHUNKS["size-over-64-bits"]))

    assert "chunked" in assert_refused(answers, 400)["message"]
    assert fake_upstream.requests == []


async def test_stalled_body_on_messages_is_408_in_anthropic_shape(gw: RunningGateway) -> None:
    answers = await converse(
        gw, f"POST {MESSAGES} HTTP/1.1\r\nhost: llmgw\r\ncontent-length: 10\r\n\r\n{{".encode()
    )

    assert [a.status_code for a in answers] == [408], answers
    assert answers[0].json()["type"] == "error"


# -- connections ---------------------------------------------------------------------------

CLOSE_WAIT = "08"  # the socket state in /proc/net/tcp


def close_wait_sockets(port: int) -> int:
    """How many sockets on this host are in CLOSE-WAIT on local ``port`` (Linux /proc)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == CLOSE_WAIT:
                    count += 1
    return count


async def test_keep_alive_connections_the_client_ends_are_closed_by_the_server_at_once(
    gw: RunningGateway,
) -> None:
    async def one_connection() -> bytes:
        keep_alive = b"GET /health HTTP/1.1\r\nhost: llmgw\r\n\r\n"
        async with connection(gw, keep_alive) as (reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            (answer,) = parse_answers(head)
            await reader.readexactly(int(answer.headers["content-length"]))
            writer.write_eof()  # the client is done: the server sees end of stream
            return await reader.read()  # b"" once the server has closed its side

    async with asyncio.timeout(WAIT):  # the keep-alive timeout (75 s) would end them later
        rests = await asyncio.gather(*(one_connection() for _ in range(100)))

    assert rests == [b""] * 100
    assert close_wait_sockets(port_of(gw)) == 0
