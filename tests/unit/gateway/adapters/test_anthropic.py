"""gateway.adapters.anthropic: the HTTP side of the ``anthropic`` upstream kind.

Driven through a stand-in for the pooled client (handlers answer ``httpx.Request`` with
``httpx.Response``, as with ``httpx.MockTransport``) with the recorded Anthropic answers in
``tests/fixtures/wire``: where requests go and with which headers, answers and streams back
as canonical chat, and every way a call fails as an UpstreamError.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.adapters.anthropic import ANTHROPIC_VERSION, AnthropicAdapter, messages_url
from gateway.adapters.anthropic_wire import UpstreamStreamError
from gateway.adapters.base import JSON, UnsupportedParameterError, UpstreamTarget
from gateway.adapters.upstream_http import Answer
from schemas import UpstreamBadResponseError, UpstreamError
from schemas.text_chunk import chunk_json

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

WIRE = Path(__file__).parents[3] / "fixtures" / "wire"
CHAT: JSON = {"model": "m", "messages": [{"role": "user", "content": "weather?"}]}
SSE = {"content-type": "text/event-stream"}


def target(
    base_url: str = "https://api.anthropic.com", key: str | None = "sk-ant"
) -> UpstreamTarget:
    return UpstreamTarget(
        endpoint="m:anthropic-api",
        kind="anthropic",
        base_url=base_url,
        upstream_model="claude-x",
        api_key=key,
        timeout=5.0,
        connect_timeout=1.0,
    )


class _Streaming:
    """What UpstreamHTTP.stream yields, over an httpx.Response."""

    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self.headers = resp.headers
        self._resp = resp

    async def read(self) -> bytes:
        return await self._resp.aread()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for piece in self._resp.aiter_raw():
            yield piece


class _RecordedHTTP:
    """Stands in for UpstreamHTTP: same calls, answered by ``handler`` in this process; a
    handler raising httpx.ConnectError is a refused connection (UpstreamError "connect")."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self._handler = handler

    def _answer(
        self, endpoint: str, url: str, body: bytes, headers: Mapping[str, str]
    ) -> httpx.Response:
        try:
            return self._handler(httpx.Request("POST", url, headers=dict(headers), content=body))
        except httpx.ConnectError:
            raise UpstreamError(
                "upstream connection failed (refused)", endpoint=endpoint, kind="connect"
            ) from None

    async def post(
        self, endpoint: str, url: str, body: bytes, headers: Mapping[str, str], **_: float
    ) -> Answer:
        resp = self._answer(endpoint, url, body, headers)
        return Answer(resp.status_code, resp.headers, await resp.aread())

    @asynccontextmanager
    async def stream(
        self, endpoint: str, url: str, body: bytes, headers: Mapping[str, str], **_: float
    ) -> AsyncIterator[_Streaming]:
        yield _Streaming(self._answer(endpoint, url, body, headers))


def adapter(
    handler: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request]
) -> AnthropicAdapter:
    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return AnthropicAdapter(_RecordedHTTP(record))  # type: ignore[arg-type]


def stream_body(*, drop_from: str | None = None) -> bytes:
    """The recorded tool-use stream, optionally cut just before the first ``drop_from`` event."""
    text = (WIRE / "anthropic_stream_tool_use.sse").read_text()
    if drop_from is not None:
        text = text[: text.index(f"event: {drop_from}")]
    return text.encode()


class _Pieces(httpx.AsyncByteStream):
    """A streamed body in 50-byte pieces, so SSE frames arrive split across reads."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._body), 50):
            yield self._body[i : i + 50]


def sse(body: bytes) -> httpx.Response:
    return httpx.Response(200, headers=SSE, stream=_Pieces(body))


async def collect(a: AnthropicAdapter, body: JSON) -> list[JSON]:
    return [chunk_json(c) async for batch in a.stream(target(), body) for c in batch]


@pytest.mark.parametrize("base", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_messages_url_with_or_without_trailing_v1(base: str) -> None:
    assert messages_url(base) == "http://h:1/v1/messages"


async def test_complete_posts_messages_with_key_and_version_and_returns_chat() -> None:
    seen: list[httpx.Request] = []
    answer = json.loads((WIRE / "anthropic_message_tool_use.json").read_text())
    a = adapter(lambda r: httpx.Response(200, json=answer), seen)

    chat = await a.complete(target("https://api.anthropic.com/v1"), {**CHAT, "stream": False})

    (req,) = seen
    assert str(req.url) == "https://api.anthropic.com/v1/messages"
    assert req.headers["x-api-key"] == "sk-ant"
    assert req.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "authorization" not in req.headers
    sent = json.loads(req.content)
    assert sent["model"] == "claude-x" and "stream" not in sent
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = chat["choices"][0]["message"]["tool_calls"]
    assert call["id"] == "toolu_01A09q90qw90lq917835lq9"
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 2048


async def test_stream_translates_events_in_order_and_stops_at_message_stop() -> None:
    seen: list[httpx.Request] = []
    a = adapter(lambda r: sse(stream_body()), seen)

    chunks = await collect(a, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})

    assert json.loads(seen[0].content)["stream"] is True
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Okay, let's check the weather for San Francisco, CA:"
    args = "".join(
        call["function"]["arguments"]
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls") or ()
    )
    assert json.loads(args) == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_stream_without_usage_requested_sends_no_usage_chunk() -> None:
    a = adapter(lambda r: sse(stream_body()), [])

    chunks = await collect(a, {**CHAT, "stream": True})

    assert all(c["choices"] for c in chunks)


async def test_stream_ending_without_message_stop_raises_truncated() -> None:
    body = stream_body(drop_from="message_stop")
    a = adapter(lambda r: sse(body), [])

    with pytest.raises(UpstreamError) as exc:
        await collect(a, {**CHAT, "stream": True})

    assert exc.value.kind == "truncated" and exc.value.counts_against_endpoint


async def test_stream_error_event_raises_with_the_endpoint_and_its_status() -> None:
    body = stream_body(drop_from="content_block_stop") + (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n'
    )
    a = adapter(lambda r: sse(body), [])

    with pytest.raises(UpstreamStreamError) as exc:
        await collect(a, {**CHAT, "stream": True})

    assert exc.value.endpoint == "m:anthropic-api"
    assert exc.value.status == 529 and "Overloaded" in exc.value.message


async def test_stream_event_that_is_not_json_is_a_bad_response() -> None:
    body = b"event: message_start\ndata: {not json\n\n"
    a = adapter(lambda r: sse(body), [])

    with pytest.raises(UpstreamBadResponseError):
        await collect(a, {**CHAT, "stream": True})


@pytest.mark.parametrize("stream", [False, True])
async def test_non_2xx_keeps_status_message_and_retry_after(stream: bool) -> None:
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    a = adapter(lambda r: httpx.Response(429, json=error, headers={"retry-after": "3"}), [])

    with pytest.raises(UpstreamError) as exc:
        if stream:
            await collect(a, {**CHAT, "stream": True})
        else:
            await a.complete(target(), CHAT)

    assert (exc.value.status, exc.value.message, exc.value.retry_after) == (429, "slow down", 3.0)


@pytest.mark.parametrize(
    ("answer", "what"), [(b"{not json", "not JSON"), (b'{"id": "msg_1"}', "content")]
)
async def test_answer_that_is_not_a_message_is_a_bad_response(answer: bytes, what: str) -> None:
    a = adapter(lambda r: httpx.Response(200, content=answer), [])

    with pytest.raises(UpstreamBadResponseError) as exc:
        await a.complete(target(), CHAT)

    assert what in exc.value.message


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}, {"temperature": 1.5}])
async def test_what_anthropic_cannot_honour_is_a_400_naming_it_and_nothing_is_sent(
    extra: dict[str, Any],
) -> None:
    seen: list[httpx.Request] = []
    a = adapter(lambda r: httpx.Response(500), seen)

    with pytest.raises(UnsupportedParameterError) as exc:
        await a.complete(target(), {**CHAT, **extra})

    (param,) = extra
    assert (exc.value.status, exc.value.param) == (400, param)
    assert not exc.value.counts_against_endpoint
    assert seen == []


async def test_transport_failure_is_an_upstream_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    a = adapter(refuse, [])

    with pytest.raises(UpstreamError) as exc:
        await a.complete(target(), CHAT)

    assert exc.value.kind == "connect"


async def test_embeddings_are_refused_as_a_request_error() -> None:
    a = adapter(lambda r: httpx.Response(500), [])

    with pytest.raises(UpstreamError) as exc:
        await a.embed(target(), {"model": "m", "input": "x"})

    assert exc.value.status == 400 and "no embeddings API" in exc.value.message
