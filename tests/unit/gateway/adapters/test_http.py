"""UpstreamHTTP against a real loopback server: answers, streams, and every transport failure
as an UpstreamError."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import msgspec
import pytest

from gateway.adapters.upstream_http import UpstreamHTTP
from schemas import UpstreamError, UpstreamTimeoutError
from tests.fixtures.upstream import FakeUpstream, Hang, Stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

BODY = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP()
    yield client
    await client.aclose()


async def test_post_returns_status_headers_and_whole_body(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    answer = await http.post(
        "e",
        fake_upstream.openai_base_url + "/chat/completions",
        BODY,
        JSON_HEADERS,
        timeout=5,
        connect_timeout=1,
    )
    assert answer.status == 200
    assert answer.headers["x-fake-upstream"] == "up1"
    assert msgspec.json.decode(answer.body)["object"] == "chat.completion"


async def test_stream_yields_the_body_as_it_arrives(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Stream(chunks=3))
    async with http.stream(
        "e",
        fake_upstream.openai_base_url + "/chat/completions",
        BODY,
        JSON_HEADERS,
        timeout=5,
        connect_timeout=1,
    ) as resp:
        body = b"".join([piece async for piece in resp.chunks()])
    assert resp.status == 200 and body.endswith(b"data: [DONE]\n\n")


async def test_stream_abandoned_half_read_closes_the_upstream_connection(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Stream(chunks=5, stall_after=1))
    async with http.stream(
        "e",
        fake_upstream.openai_base_url + "/chat/completions",
        BODY,
        JSON_HEADERS,
        timeout=5,
        connect_timeout=1,
    ) as resp:
        async for _ in resp.chunks():
            break
    await fake_upstream.wait_for_disconnects(1)


async def test_refused_connection_is_a_connect_upstream_error(http: UpstreamHTTP) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(UpstreamError) as exc:
            await http.post(
                "e",
                f"http://127.0.0.1:{port}/v1/x",
                BODY,
                JSON_HEADERS,
                timeout=5,
                connect_timeout=1,
            )
    assert exc.value.kind == "connect" and exc.value.counts_against_endpoint
    assert not isinstance(exc.value, UpstreamTimeoutError)


async def test_silent_upstream_is_an_upstream_timeout(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Hang())
    with pytest.raises(UpstreamTimeoutError):
        await http.post(
            "e",
            fake_upstream.openai_base_url + "/chat/completions",
            BODY,
            JSON_HEADERS,
            timeout=0.2,
            connect_timeout=1,
        )


async def test_upstream_cookies_are_never_replayed_to_later_requests(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    from tests.fixtures.upstream import Reply

    fake_upstream.enqueue(Reply(headers={"Set-Cookie": "session=caller-a; Path=/"}))
    # A host name, not an address: a cookie jar would keep cookies for it.
    url = f"http://localhost:{fake_upstream.port}/v1/chat/completions"
    await http.post("e", url, BODY, JSON_HEADERS, timeout=5, connect_timeout=1)
    await http.post("e", url, BODY, JSON_HEADERS, timeout=5, connect_timeout=1)

    assert "cookie" not in fake_upstream.requests[1].headers


async def test_a_shorter_read_timeout_applies_on_a_kept_alive_connection(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    url = fake_upstream.openai_base_url + "/chat/completions"
    answer = await http.post("e", url, BODY, JSON_HEADERS, timeout=5, connect_timeout=1)
    assert answer.status == 200
    fake_upstream.enqueue(Hang())
    with pytest.raises(UpstreamTimeoutError):  # not the 5 s of the request before
        await http.post("e", url, BODY, JSON_HEADERS, timeout=0.2, connect_timeout=1)
