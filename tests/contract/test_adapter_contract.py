"""One behaviour suite that every upstream adapter passes (``openai_compat``, ``anthropic``,
``azure_openai``, ``gemini``, ``bedrock``, ``echo``), as tests/contract/test_bus.py does for buses.

What the adapter seam promises (gateway/adapters/base.py): canonical chat requests in,
canonical answers out; a stream comes in non-empty batches of ``chat.completion.chunk`` dicts
whose final batch is ``last`` and says why it stopped; every failure is an ``UpstreamError``
(timeouts ``UpstreamTimeoutError``, garbage ``UpstreamBadResponseError``) carrying the HTTP
status, the upstream's own message and its ``Retry-After``, and whether it counts against the
endpoint; a stream that ends without its terminator raises; a cancelled or abandoned call lets
the upstream see its client go away.

``any_adapter`` runs a row over every kind; ``http_adapter`` over those that call an
upstream (the fake upstream, a real HTTP server on loopback, in each kind's own dialect;
``bedrock``'s is tests/fixtures/upstream_bedrock.py, which verifies each SigV4 signature): the
echo adapter has no network, so rows about the wire do not apply to it and are not run for it.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest

from gateway.adapters.base import Batch, UpstreamTarget
from gateway.adapters.registry import make_adapters, make_http_client
from schemas import UpstreamBadResponseError, UpstreamError, UpstreamTimeoutError
from schemas.bedrock_settings import BedrockSettings
from schemas.text_chunk import chunk_json
from tests.fixtures.upstream import FakeUpstream, Hang, Reply, Reset, Stream, ToolCall
from tests.fixtures.upstream_bedrock import (
    BEDROCK_KEY,
    BEDROCK_REGION,
    FakeBedrock,
    event,
    exception,
    frame,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from gateway.adapters.base import JSON, Adapter

ALL_KINDS = ["openai_compat", "anthropic", "azure_openai", "gemini", "bedrock", "echo"]
HTTP_KINDS = ["openai_compat", "anthropic", "azure_openai", "gemini", "bedrock"]
KEY = "sk-contract-key"
KEYS = {"bedrock": BEDROCK_KEY}  # a bedrock key is ACCESS_KEY_ID:SECRET_ACCESS_KEY
UPSTREAM_MODEL = "upstream-model"
SHORT = 0.2  # a read timeout a hanging upstream runs into

HI: JSON = {
    "model": "public-model",
    "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 64,
}
TOOLS: JSON = {
    **HI,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
}


@dataclass
class Under:
    """One adapter under test, the target it is called with, and its upstream (None: echo)."""

    kind: str
    adapter: Adapter
    target: UpstreamTarget
    upstream: FakeUpstream | None

    @property
    def up(self) -> FakeUpstream:
        assert self.upstream is not None, "an HTTP-only row ran on the echo adapter"
        return self.upstream

    def script(self, *behaviours: Any) -> None:
        """Queue behaviours on the upstream (the echo adapter answers by itself)."""
        if self.upstream is not None:
            self.upstream.enqueue(*behaviours)

    def limited(self, timeout: float) -> UpstreamTarget:
        """The target with a read timeout of ``timeout`` seconds."""
        return dataclasses.replace(self.target, timeout=timeout)


def _base_url(kind: str, up: FakeUpstream) -> str:
    return {
        "openai_compat": up.openai_base_url,
        "anthropic": up.anthropic_base_url,
        "azure_openai": up.azure_base_url,
        "gemini": up.gemini_base_url,
        "bedrock": up.anthropic_base_url,  # the fake's root: Bedrock's paths start there
    }[kind]


def _key(kind: str) -> str:
    return KEYS.get(kind, KEY)


async def _under(kind: str, fake_upstream: FakeUpstream) -> AsyncIterator[Under]:
    http = make_http_client()
    bedrock = FakeBedrock() if kind == "bedrock" else None
    up = await bedrock.start() if bedrock is not None else fake_upstream
    try:
        target = UpstreamTarget(
            endpoint=f"contract/{kind}",
            kind=kind,
            base_url="" if kind == "echo" else _base_url(kind, up),
            upstream_model=UPSTREAM_MODEL,
            api_key=_key(kind),
            timeout=10.0,
            connect_timeout=5.0,
            ttft_timeout=10.0,
            idle_timeout=10.0,
            bedrock=BedrockSettings(region=BEDROCK_REGION) if kind == "bedrock" else None,
        )
        yield Under(kind, make_adapters(http)[kind], target, None if kind == "echo" else up)
    finally:
        await http.aclose()
        if bedrock is not None:
            await bedrock.close()


@pytest.fixture(params=ALL_KINDS)
async def any_adapter(
    request: pytest.FixtureRequest, fake_upstream: FakeUpstream
) -> AsyncIterator[Under]:
    async for under in _under(str(request.param), fake_upstream):
        yield under


@pytest.fixture(params=HTTP_KINDS)
async def http_adapter(
    request: pytest.FixtureRequest, fake_upstream: FakeUpstream
) -> AsyncIterator[Under]:
    async for under in _under(str(request.param), fake_upstream):
        yield under


async def _batches(u: Under, body: JSON, target: UpstreamTarget | None = None) -> list[Batch]:
    return [b async for b in u.adapter.stream(target or u.target, body)]


def _text_of(batches: list[Batch]) -> str:
    return "".join(
        str(choice.get("delta", {}).get("content") or "")
        for batch in batches
        for chunk in map(chunk_json, batch)
        for choice in chunk.get("choices") or ()
    )


def _finish_reasons(batches: list[Batch]) -> list[str]:
    return [
        str(choice["finish_reason"])
        for batch in batches
        for chunk in map(chunk_json, batch)
        for choice in chunk.get("choices") or ()
        if choice.get("finish_reason")
    ]


def _usage_of(batches: list[Batch]) -> list[JSON]:
    chunks = [chunk_json(chunk) for batch in batches for chunk in batch]
    return [chunk["usage"] for chunk in chunks if chunk.get("usage")]


# -- answers: every kind ----------------------------------------------------------------------


async def test_adapter_complete_answers_a_canonical_chat_completion(any_adapter: Under) -> None:
    answer = await any_adapter.adapter.complete(any_adapter.target, HI)

    assert answer["object"] == "chat.completion"
    (choice,) = answer["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    usage = answer["usage"]
    assert isinstance(usage["prompt_tokens"], int) and isinstance(usage["completion_tokens"], int)


async def test_adapter_stream_says_what_complete_says_in_batches_ending_with_the_last(
    any_adapter: Under,
) -> None:
    whole = await any_adapter.adapter.complete(any_adapter.target, HI)
    any_adapter.script(Stream())

    batches = await _batches(any_adapter, {**HI, "stream": True})

    assert batches and all(len(b) > 0 for b in batches)
    assert all(chunk_json(c)["object"] == "chat.completion.chunk" for b in batches for c in b)
    assert [b.last for b in batches] == [False] * (len(batches) - 1) + [True]
    assert _text_of(batches) == whole["choices"][0]["message"]["content"]
    assert _finish_reasons(batches) == ["stop"]


async def test_adapter_stream_reports_usage_when_asked(any_adapter: Under) -> None:
    any_adapter.script(Stream())
    body = {**HI, "stream": True, "stream_options": {"include_usage": True}}

    usages = _usage_of(await _batches(any_adapter, body))

    assert usages, "no chunk carried usage"
    assert isinstance(usages[-1]["prompt_tokens"], int)
    assert isinstance(usages[-1]["completion_tokens"], int)


async def test_adapter_forced_tool_choice_answers_a_call_of_that_tool(any_adapter: Under) -> None:
    any_adapter.script(ToolCall("get_weather", '{"city": "Paris"}'))

    answer = await any_adapter.adapter.complete(any_adapter.target, TOOLS)

    (choice,) = answer["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert isinstance(call["function"]["arguments"], str)
    assert choice["finish_reason"] == "tool_calls"


TITAN, COHERE = "amazon.titan-embed-text-v2:0", "cohere.embed-english-v3"


@pytest.mark.parametrize(
    ("kind", "upstream_model", "has_embeddings"),
    [
        ("openai_compat", UPSTREAM_MODEL, True),
        ("anthropic", UPSTREAM_MODEL, False),
        ("azure_openai", UPSTREAM_MODEL, True),
        ("gemini", UPSTREAM_MODEL, True),
        ("bedrock", TITAN, True),
        ("bedrock", COHERE, True),
        ("bedrock", UPSTREAM_MODEL, False),  # a chat model: no embeddings body for it
        ("echo", UPSTREAM_MODEL, True),
    ],
)
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_adapter_embeddings_answer_or_a_400_that_spares_the_endpoint(
    fake_upstream: FakeUpstream,
    kind: str,
    upstream_model: str,
    has_embeddings: bool,
    encoding_format: str,
) -> None:
    async for u in _under(kind, fake_upstream):
        target = dataclasses.replace(u.target, upstream_model=upstream_model)
        body = {"model": "public-model", "input": ["a", "b"], "encoding_format": encoding_format}
        if has_embeddings:
            answer = await u.adapter.embed(target, body)
            assert [item["index"] for item in answer["data"]] == [0, 1]
            first, second = (_floats(item["embedding"]) for item in answer["data"])
            assert len(first) == len(second) > 0 and first != second
            # Counted, or unknown (None: Gemini's reports none), never a made-up 0.
            usage = answer["usage"]
            assert usage is None if kind == "gemini" else usage["prompt_tokens"] > 0
        else:
            with pytest.raises(UpstreamError) as err:
                await u.adapter.embed(target, body)
            assert err.value.status == 400
            assert not err.value.counts_against_endpoint


def _floats(embedding: Any) -> list[float]:
    """An embedding as floats, whether sent as a list or as base64 float32 (OpenAI's form)."""
    if isinstance(embedding, str):
        return array.array("f", base64.b64decode(embedding)).tolist()
    assert all(isinstance(v, float) for v in embedding)
    return list(embedding)


# -- the wire: kinds that call an upstream ----------------------------------------------------


async def test_adapter_sends_the_routes_model_and_credential(http_adapter: Under) -> None:
    u = http_adapter

    await u.adapter.complete(u.target, HI)
    await _batches(u, {**HI, "stream": True})

    plain, streamed = u.up.requests
    key = _key(u.kind)
    assert (plain.model, plain.credential, plain.stream) == (UPSTREAM_MODEL, key, False)
    assert (streamed.model, streamed.credential, streamed.stream) == (UPSTREAM_MODEL, key, True)


async def test_adapter_usage_is_the_upstreams(http_adapter: Under) -> None:
    u = http_adapter

    answer = await u.adapter.complete(u.target, HI)

    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (
        u.up.prompt_tokens,
        u.up.completion_tokens,
    )


@pytest.mark.parametrize(
    ("status", "counts"),
    [(400, False), (404, False), (422, False), (401, True), (429, True), (500, True), (503, True)],
)
@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_maps_an_error_status_with_its_message_and_retry_after(
    http_adapter: Under,
    status: int,
    counts: bool,
    stream: bool,
) -> None:
    u = http_adapter
    u.script(Reply(status, headers={"Retry-After": "7"}))

    with pytest.raises(UpstreamError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True})
        else:
            await u.adapter.complete(u.target, HI)

    assert err.value.status == status
    assert err.value.message == f"fake upstream {u.up.name}: HTTP {status}"
    assert err.value.retry_after == 7.0
    assert err.value.counts_against_endpoint is counts
    assert err.value.endpoint == u.target.endpoint
    assert _key(u.kind) not in str(err.value)


async def test_adapter_garbage_answer_is_a_bad_response(http_adapter: Under) -> None:
    u = http_adapter
    u.script(Reply(200, body="{not json", headers={"content-type": "application/json"}))

    with pytest.raises(UpstreamBadResponseError) as err:
        await u.adapter.complete(u.target, HI)

    assert err.value.counts_against_endpoint


_GARBAGE_EVENT: dict[str, str | bytes] = {
    "openai_compat": "data: {not json\n\n",
    "anthropic": "data: {not json\n\n",
    "azure_openai": "data: {not json\n\n",
    "gemini": "data: {not json\n\n",
    # A well-framed event whose payload is not JSON, then one whose message CRC is wrong.
    "bedrock": frame({":event-type": "messageStart", ":message-type": "event"}, b"{not json"),
}


async def test_adapter_garbage_stream_event_is_a_bad_response(http_adapter: Under) -> None:
    u = http_adapter
    u.script(Reply(200, body=_GARBAGE_EVENT[u.kind], headers={"content-type": "text/event-stream"}))

    with pytest.raises(UpstreamBadResponseError):
        await _batches(u, {**HI, "stream": True})


_BEDROCK_HEL = event("messageStart", {"role": "assistant"}) + event(
    "contentBlockDelta", {"delta": {"text": "Hel"}, "contentBlockIndex": 0}
)
# An in-band error after some content, in each kind's dialect.
_IN_BAND_ERROR: dict[str, Any] = {
    "bedrock": _BEDROCK_HEL + exception("modelStreamErrorException", "overloaded right now"),
    "openai_compat": (
        'data: {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": '
        '[{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, '
        '"finish_reason": null}]}\n\n'
        'data: {"error": {"message": "overloaded right now"}}\n\n'
    ),
    "anthropic": (
        'event: message_start\ndata: {"type": "message_start", "message": {"id": "m1", '
        '"type": "message", "role": "assistant", "model": "m", "content": [], '
        '"stop_reason": null, "usage": {"input_tokens": 3, "output_tokens": 0}}}\n\n'
        'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
        '"content_block": {"type": "text", "text": ""}}\n\n'
        'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
        '"delta": {"type": "text_delta", "text": "Hel"}}\n\n'
        'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
        '"message": "overloaded right now"}}\n\n'
    ),
    "gemini": (
        'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, '
        '"index": 0}], "modelVersion": "m", "responseId": "r1"}\n\n'
        'data: {"error": {"code": 503, "message": "overloaded right now", '
        '"status": "UNAVAILABLE"}}\n\n'
    ),
}
_IN_BAND_ERROR["azure_openai"] = _IN_BAND_ERROR["openai_compat"]


async def test_adapter_in_band_stream_error_raises_after_the_content_before_it(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Reply(200, body=_IN_BAND_ERROR[u.kind], headers={"content-type": "text/event-stream"}))
    got: list[Batch] = []

    with pytest.raises(UpstreamError) as err:
        async for batch in u.adapter.stream(u.target, {**HI, "stream": True}):
            got.append(batch)

    assert "overloaded right now" in err.value.message
    assert _text_of(got) == "Hel"


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_error_echoing_the_credential_it_was_sent_is_redacted(
    http_adapter: Under, stream: bool
) -> None:
    u = http_adapter
    key = _key(u.kind)
    echo = f"Incorrect API key: {key}; sent authorization: Bearer {key}"
    u.script(Reply(401, body={"error": {"message": echo}, "type": "error"}))

    with pytest.raises(UpstreamError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True})
        else:
            await u.adapter.complete(u.target, HI)

    assert key not in str(err.value) and key.encode() not in err.value.body
    assert err.value.message == (
        "Incorrect API key: [redacted]; sent authorization: Bearer [redacted]"
    )
    assert err.value.status == 401 and err.value.is_auth_rejection


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_error_with_a_long_message_is_clipped_after_its_credential_is_redacted(
    http_adapter: Under, stream: bool
) -> None:
    # A 5xx carrying a 64 MiB message went to the client whole. The key sits across the
    # 2,000th character: clipped before redacting, its first characters would leak.
    u = http_adapter
    key = _key(u.kind)
    echo = "x" * 1980 + f" key {key} " + "y" * 5000
    u.script(Reply(401, body={"error": {"message": echo}, "type": "error"}))

    with pytest.raises(UpstreamError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True})
        else:
            await u.adapter.complete(u.target, HI)

    message = err.value.message
    assert message == ("x" * 1980 + " key [redacted] " + "y" * 5000)[:1999] + "\u2026"
    assert key[:3] not in message and str(err.value) == message
    assert key.encode() not in err.value.body  # the body is redacted, never clipped


async def test_adapter_in_band_stream_error_echoing_the_credential_is_redacted(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Stream(chunks=3, error_after=1, error="stream aborted for key {authorization}"))
    got: list[Batch] = []

    with pytest.raises(UpstreamError) as err:
        async for batch in u.adapter.stream(u.target, {**HI, "stream": True}):
            got.append(batch)

    assert _text_of(got)  # the content before the error came through
    key = _key(u.kind)
    assert key not in str(err.value) and key.encode() not in err.value.body
    assert "stream aborted for key" in err.value.message and "[redacted]" in err.value.message


# A stream that ends cleanly (the HTTP answer is complete) before its terminator.
_NO_TERMINATOR: dict[str, str | bytes] = {
    "openai_compat": _IN_BAND_ERROR["openai_compat"].split('data: {"error"')[0],
    "anthropic": _IN_BAND_ERROR["anthropic"].split("event: error")[0],
    "azure_openai": _IN_BAND_ERROR["openai_compat"].split('data: {"error"')[0],
    "gemini": _IN_BAND_ERROR["gemini"].split('data: {"error"')[0],
    "bedrock": _BEDROCK_HEL,
}


# OpenAI-compatible servers that end a finished answer's body without ``[DONE]`` exist: their
# adapters end the stream there, and the relay (``StreamAttempt``), which reads every finish
# reason, judges it whole or truncated (tests/e2e/test_stream_end_without_done_openai_sdk.py).
_RELAY_JUDGES_THE_END = ("openai_compat", "azure_openai")


async def test_adapter_stream_ending_before_its_terminator_is_no_whole_answer(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Reply(200, body=_NO_TERMINATOR[u.kind], headers={"content-type": "text/event-stream"}))

    if u.kind in _RELAY_JUDGES_THE_END:
        got = await _batches(u, {**HI, "stream": True})
        assert got and not any(b.last for b in got)  # not the answer's own end
        return
    with pytest.raises(UpstreamError) as err:
        await _batches(u, {**HI, "stream": True})

    assert err.value.kind == "truncated"
    assert err.value.counts_against_endpoint


async def test_adapter_stream_cut_mid_answer_raises_after_the_chunks_before_the_cut(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Stream(chunks=3, cut_after=1))
    got: list[Batch] = []

    with pytest.raises(UpstreamError) as err:
        async for batch in u.adapter.stream(u.target, {**HI, "stream": True}):
            got.append(batch)

    assert _text_of(got)  # the content before the cut came through
    assert not any(b.last for b in got)
    assert err.value.status is None and err.value.counts_against_endpoint


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_silent_upstream_times_out(http_adapter: Under, stream: bool) -> None:
    u = http_adapter
    u.script(Hang())
    target = u.limited(timeout=SHORT)

    with pytest.raises(UpstreamTimeoutError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True}, target)
        else:
            await u.adapter.complete(target, HI)

    assert err.value.status is None and err.value.counts_against_endpoint
    await u.up.wait_for_disconnects(1)


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_reset_connection_is_a_transport_error(
    http_adapter: Under, stream: bool
) -> None:
    u = http_adapter
    u.script(Reset())

    with pytest.raises(UpstreamError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True})
        else:
            await u.adapter.complete(u.target, HI)

    assert err.value.status is None and err.value.counts_against_endpoint


def _refusing_port() -> int:
    """A loopback port nothing listens on (bound, never listening, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_adapter_refused_connection_is_a_connect_error(
    http_adapter: Under, stream: bool
) -> None:
    u = http_adapter
    port = _refusing_port()
    base = f"http://127.0.0.1:{port}" + ("/v1" if u.kind == "openai_compat" else "")
    target = dataclasses.replace(u.target, base_url=base)

    with pytest.raises(UpstreamError) as err:
        if stream:
            await _batches(u, {**HI, "stream": True}, target)
        else:
            await u.adapter.complete(target, HI)

    assert (err.value.status, err.value.kind) == (None, "connect")
    assert err.value.counts_against_endpoint


# -- cancellation: the upstream sees its client go away ---------------------------------------


async def test_adapter_cancelled_while_waiting_lets_the_upstream_see_the_client_go(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Hang())

    async with anyio.create_task_group() as tg:
        tg.start_soon(u.adapter.complete, u.target, HI)
        await u.up.wait_for_requests(1)
        tg.cancel_scope.cancel()

    await u.up.wait_for_disconnects(1)


async def test_adapter_stream_abandoned_mid_answer_closes_the_upstream_connection(
    http_adapter: Under,
) -> None:
    u = http_adapter
    u.script(Stream(chunks=4, stall_after=1))
    # Every adapter's stream is an async generator: closing it is how the relay abandons it.
    chunks = cast("AsyncGenerator[Batch, None]", u.adapter.stream(u.target, {**HI, "stream": True}))

    first = await anext(chunks)
    await chunks.aclose()

    assert not first.last
    await u.up.wait_for_disconnects(1)


# -- bedrock only: the event-stream framing ----------------------------------------------------


async def test_bedrock_stream_frame_with_a_wrong_crc_is_a_bad_response(
    fake_upstream: FakeUpstream,
) -> None:
    corrupt = event("messageStart", {"role": "assistant"})[:-1] + b"\x00"
    async for u in _under("bedrock", fake_upstream):
        u.script(Reply(200, body=corrupt, headers={"content-type": "text/event-stream"}))

        with pytest.raises(UpstreamBadResponseError):
            await _batches(u, {**HI, "stream": True})
