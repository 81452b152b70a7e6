"""A ``gemini`` or ``bedrock`` upstream's answer or stream event whose parts break its API's
shapes (google-genai's ``GenerateContentResponse``, botocore's ``ConverseResponse`` and
``ConverseStreamOutput``) is the upstream's bad response, on every client surface: a 502 in
the surface's shape before the first byte (another route is tried), the dialect's stream error
after it; never a 500, a logged traceback or a torn connection. So is an embedding whose
values are not numbers. Raw httpx on loopback, against the scripted fake upstreams (the Gemini
API's, and the fake Bedrock's event-stream frames).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

from schemas import Observation, subjects
from tests.e2e.bad_answers_support import (
    SSE,
    TINY,
    ended_cleanly,
    ended_in_error,
    is_bad_response,
    no_traceback,
    post,
    start_gateway,
)
from tests.e2e.conftest import ONE_BUS, eid, route, watch
from tests.fixtures.upstream import FakeUpstream, Reply
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock, event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

SURFACES = ("chat", "responses", "messages")
TITAN = "amazon.titan-embed-text-v2:0"


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[[str], Awaitable[FakeUpstream]]]:
    """Factory: ``await upstreams(kind)``, a started fake speaking ``kind``; closed after."""
    started: list[FakeUpstream] = []

    async def make(kind: str) -> FakeUpstream:
        name = f"{kind}{len(started) + 1}"
        up = FakeBedrock(name) if kind == "bedrock" else FakeUpstream(name)
        await up.start()
        started.append(up)
        return up

    try:
        yield make
    finally:
        for up in reversed(started):
            await up.close()


def _route(kind: str, up: FakeUpstream, model_id: str = "m-up") -> dict[str, Any]:
    if kind == "gemini":
        url = up.gemini_base_url
        return {"kind": kind, "base_url": url, "provider_model_id": model_id, "api_key": "k"}
    return {
        "kind": kind,
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": model_id,
        "api_key": BEDROCK_KEY,
    }


# -- gemini: a stream is SSE of GenerateContentResponse; bedrock: event-stream frames --------


def _gemini(parts: Any, finish: Any = None, **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "responseId": "r1", **extra}


def _sse(*answers: dict[str, Any]) -> bytes:
    return "".join(f"data: {json.dumps(a)}\n\n" for a in answers).encode()


GM_OPENING = _sse(_gemini([{"text": "Hel"}]))
GM_CLOSING = _sse(_gemini([{"text": "lo"}], "STOP", usageMetadata={"promptTokenCount": 2}))
GM_BAD: dict[str, bytes] = {
    "candidates": _sse({"candidates": "str"}),
    "content": _sse({"candidates": [{"content": "str"}]}),
    "text": _sse(_gemini([{"text": 5}])),
    "args": _sse(_gemini([{"functionCall": {"name": "f", "args": [1]}}])),
}
BR_OPENING = event("messageStart", {"role": "assistant"}) + event(
    "contentBlockDelta", {"delta": {"text": "Hel"}, "contentBlockIndex": 0}
)
BR_CLOSING = (
    event("contentBlockDelta", {"delta": {"text": "lo"}, "contentBlockIndex": 0})
    + event("contentBlockStop", {"contentBlockIndex": 0})
    + event("messageStop", {"stopReason": "end_turn"})
    + event("metadata", {"usage": {"inputTokens": 2, "outputTokens": 2, "totalTokens": 4}})
)
BR_BAD: dict[str, bytes] = {
    "delta": event("contentBlockDelta", {"delta": "str", "contentBlockIndex": 0}),
    "text": event("contentBlockDelta", {"delta": {"text": 5}, "contentBlockIndex": 0}),
    "start": event("contentBlockStart", {"start": {"toolUse": "f"}, "contentBlockIndex": 1}),
    "stopReason": event("messageStop", {"stopReason": ["end_turn"]}),
}
# kind -> (the stream's opening, its closing, a misshapen event by name)
STREAMS = {"gemini": (GM_OPENING, GM_CLOSING, GM_BAD), "bedrock": (BR_OPENING, BR_CLOSING, BR_BAD)}
BAD_EVENTS = [(kind, bad) for kind, (_, _, bads) in STREAMS.items() for bad in bads]


def _stream(kind: str, *frames: bytes) -> Reply:
    return Reply(body=b"".join(frames), headers=SSE if kind == "gemini" else {})


@pytest.mark.parametrize(("kind", "bad"), BAD_EVENTS)
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_malformed_event_before_the_first_chunk_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    caplog: pytest.LogCaptureFixture,
    surface: str,
    kind: str,
    bad: str,
) -> None:
    # A string where an object belongs raised AttributeError in the translation: a 500
    # "internal gateway error" and a logged traceback; a text of 5 or a stopReason that was
    # a list was relayed, or read as end_turn.
    caplog.set_level(logging.WARNING)
    opening, closing, bads = STREAMS[kind]
    up = await upstreams(kind)
    up.set_default(_stream(kind, bads[bad], opening, closing))
    gw = await start_gateway(gateway_factory, _route(kind, up))

    status, body = await post(gw, surface, stream=True)

    assert is_bad_response(surface, status, body), body
    no_traceback(caplog)


@pytest.mark.parametrize(("kind", "bad"), BAD_EVENTS)
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_malformed_event_mid_stream_ends_in_the_dialect_stream_error(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    caplog: pytest.LogCaptureFixture,
    surface: str,
    kind: str,
    bad: str,
) -> None:
    # The same AttributeError after the first chunk tore the connection mid-body.
    caplog.set_level(logging.WARNING)
    opening, closing, bads = STREAMS[kind]
    up = await upstreams(kind)
    up.set_default(_stream(kind, opening, bads[bad], closing))
    gw = await start_gateway(gateway_factory, _route(kind, up))

    status, body = await post(gw, surface, stream=True)

    assert status == 200 and "Hel" in body, body
    assert ended_in_error(surface, body) and "invalid response" in body, body
    no_traceback(caplog)


# -- whole answers -----------------------------------------------------------------------------


def _converse(content: Any, stop: Any = "end_turn") -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"output": {"message": message}, "stopReason": stop, "usage": {"inputTokens": 1}}


ANSWERS: dict[str, dict[str, Any]] = {
    "gemini candidates str": {"candidates": "str"},
    "gemini text int": _gemini([{"text": 5}], "STOP"),
    "gemini finishReason int": _gemini([{"text": "a"}], 5),
    "gemini blockReason list": {"promptFeedback": {"blockReason": ["SAFETY"]}},
    "bedrock content str": _converse("hi"),
    "bedrock text int": _converse([{"text": 5}]),
    "bedrock toolUse str": _converse([{"toolUse": "f"}]),
    "bedrock stopReason list": _converse([{"text": "a"}], ["end_turn"]),
}


@pytest.mark.parametrize("case", ANSWERS)
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_malformed_whole_answer_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    caplog: pytest.LogCaptureFixture,
    surface: str,
    case: str,
) -> None:
    # {"candidates": "str"} and a stopReason that was a list raised out of the translation
    # (a 500 and a traceback); a content string was read as no content (a 200 saying nothing).
    caplog.set_level(logging.WARNING)
    kind = case.split()[0]
    up = await upstreams(kind)
    up.set_default(Reply(body=ANSWERS[case]))
    gw = await start_gateway(gateway_factory, _route(kind, up))

    status, body = await post(gw, surface, stream=False)

    assert is_bad_response(surface, status, body), body
    no_traceback(caplog)


FAILOVER = {
    "gemini stream": _stream("gemini", GM_BAD["candidates"], GM_OPENING, GM_CLOSING),
    "bedrock stream": _stream("bedrock", BR_BAD["delta"], BR_OPENING, BR_CLOSING),
    "gemini answer": Reply(body=ANSWERS["gemini candidates str"]),
    "bedrock answer": Reply(body=ANSWERS["bedrock stopReason list"]),
}


@pytest.mark.parametrize("case", FAILOVER)
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_malformed_answer_before_the_first_byte_fails_over_to_the_next_route(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    surface: str,
    case: str,
) -> None:
    kind, shape = case.split()
    evil, good = await upstreams(kind), await upstreams("openai")
    evil.set_default(FAILOVER[case])
    gw = await start_gateway(gateway_factory, _route(kind, evil), route(good, TINY))

    status, body = await post(gw, surface, stream=shape == "stream")

    assert status == 200, body
    assert shape == "answer" or ended_cleanly(surface, body), body
    assert len(evil.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_gemini_answer_missing_a_thought_signature_fails_over_not_an_empty_stop(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    surface: str,
    stream: bool,
) -> None:
    # finishReason MISSING_THOUGHT_SIGNATURE was a "stop": the client took an empty answer
    # as complete, and no other route was tried.
    missing = _gemini([], "MISSING_THOUGHT_SIGNATURE")
    gemini, good = await upstreams("gemini"), await upstreams("openai")
    gemini.set_default(_stream("gemini", _sse(missing)) if stream else Reply(body=missing))
    gw = await start_gateway(gateway_factory, _route("gemini", gemini), route(good, TINY))

    status, body = await post(gw, surface, stream=stream)

    assert status == 200, body
    assert not stream or ended_cleanly(surface, body), body
    assert len(gemini.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_missing_thought_signature_is_the_requests_never_the_gemini_routes_failure(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    stream: bool,
) -> None:
    # Gemini says the request's history lacks a thought signature (a conversation begun on
    # another provider's route, say): the caller's request, as a 400 would be. It counted as
    # the endpoint's failure, so one client's history could open the route's circuit for all.
    missing = _gemini([], "MISSING_THOUGHT_SIGNATURE")
    gemini = await upstreams("gemini")
    gemini.set_default(_stream("gemini", _sse(missing)) if stream else Reply(body=missing))
    gw = await start_gateway(gateway_factory, _route("gemini", gemini))

    async with watch(gw, subjects.observation(eid("m", gemini))) as obs:
        answers = [await post(gw, "chat", stream=stream) for _ in range(3)]
        seen = [await obs.next(Observation) for _ in range(3)]

    assert [(o.outcome, o.status) for o in seen] == [("client_error", 400)] * 3
    for status, body in answers:
        assert status == 400, body
        assert "MISSING_THOUGHT_SIGNATURE" in body and "thought signature" in body, body
    gemini.set_default(
        _stream("gemini", GM_OPENING + GM_CLOSING)
        if stream
        else Reply(body=_gemini([{"text": "hi"}], "STOP"))
    )
    assert (await post(gw, "chat", stream=stream))[0] == 200  # its circuit never opened


BROKEN_ANSWERS = {
    "gemini MALFORMED_FUNCTION_CALL": _gemini([], "MALFORMED_FUNCTION_CALL"),
    "gemini UNEXPECTED_TOOL_CALL": _gemini([], "UNEXPECTED_TOOL_CALL"),
    "bedrock malformed_tool_use": _converse([{"text": "Let me call"}], "malformed_tool_use"),
    "bedrock malformed_model_output": _converse([{"text": "Hel"}], "malformed_model_output"),
}


def _broken(case: str, stream: bool) -> Reply:
    """``case``'s answer, whole or as its stream (Bedrock's: its start, then the stop)."""
    kind, reason = case.split()
    answer = BROKEN_ANSWERS[case]
    if not stream:
        return Reply(body=answer)
    if kind == "gemini":
        return _stream(kind, _sse(answer))
    start, stop = (
        event("messageStart", {"role": "assistant"}),
        event("messageStop", {"stopReason": reason}),
    )
    return _stream(kind, start, stop, event("metadata", {"usage": {"inputTokens": 1}}))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", BROKEN_ANSWERS)
async def test_a_broken_answer_fails_over_and_is_never_the_routes_failure(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    case: str,
    stream: bool,
) -> None:
    # An answer the model broke (a malformed or unexpected tool call, malformed output) has
    # nothing to hand on: Bedrock's was relayed as a finished "stop" (a cut text, the tool
    # call lost), and Gemini's counted as the endpoint's failure, though the request's tools
    # are what make a model answer so: one caller's tools could open the route's circuit.
    kind, reason = case.split()
    broken, good = await upstreams(kind), await upstreams("openai")
    broken.set_default(_broken(case, stream))
    two = await start_gateway(gateway_factory, _route(kind, broken), route(good, TINY))

    status, body = await post(two, "chat", stream=stream)

    assert status == 200 and len(good.requests) == 1, body
    assert not stream or ended_cleanly("chat", body), body
    await two.stop()

    alone = await start_gateway(gateway_factory, _route(kind, broken))
    async with watch(alone, subjects.observation(eid("m", broken))) as obs:
        answers = [await post(alone, "chat", stream=stream) for _ in range(3)]
        seen = [await obs.next(Observation) for _ in range(3)]

    assert [(o.outcome, o.error_kind) for o in seen] == [("client_error", "bad_response")] * 3
    for status, body in answers:
        assert is_bad_response("chat", status, body) and reason in body, body
    broken.set_default(
        _stream(kind, *(STREAMS[kind][:2])) if stream else Reply(body=_healthy(kind))
    )
    last = await post(alone, "chat", stream=stream)
    assert last[0] == 200, last  # its circuit never opened


BROKEN_AFTER_TEXT = {
    "gemini": _sse(_gemini([{"text": "Hel"}]), _gemini([], "MALFORMED_FUNCTION_CALL")),
    "bedrock": BR_OPENING
    + event("messageStop", {"stopReason": "malformed_tool_use"})
    + event("metadata", {"usage": {"inputTokens": 1}}),
}


@pytest.mark.parametrize("kind", BROKEN_AFTER_TEXT)
async def test_a_stream_the_model_broke_after_its_text_is_never_the_routes_failure(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    kind: str,
) -> None:
    # Its text reached the client, so the stream ends in the dialect's error; the relay
    # counted every error after the first byte against the route and the key (no status:
    # "no answer"), so three of one caller's streams muted the route's only key.
    up = await upstreams(kind)
    up.set_default(_stream(kind, BROKEN_AFTER_TEXT[kind]))
    gw = await start_gateway(gateway_factory, _route(kind, up))

    async with watch(gw, subjects.observation(eid("m", up))) as obs:
        answers = [await post(gw, "chat", stream=True) for _ in range(3)]
        seen = [await obs.next(Observation) for _ in range(3)]

    assert [(o.outcome, o.error_kind) for o in seen] == [("client_error", "bad_response")] * 3
    for status, body in answers:
        assert status == 200 and "Hel" in body and ended_in_error("chat", body), body
    up.set_default(_stream(kind, *STREAMS[kind][:2]))
    status, body = await post(gw, "chat", stream=True)
    assert status == 200 and ended_cleanly("chat", body), body  # never benched nor muted


def _healthy(kind: str) -> dict[str, Any]:
    return _gemini([{"text": "hi"}], "STOP") if kind == "gemini" else _converse([{"text": "hi"}])


# -- embeddings ----------------------------------------------------------------------------------

EMBEDDINGS = {
    "gemini": {"embeddings": [{"values": ["a", 0.5]}]},
    "bedrock": {"embedding": ["a", 0.5], "inputTextTokenCount": 1},
}


@pytest.mark.parametrize("kind", EMBEDDINGS)
@pytest.mark.parametrize("encoding", ["float", "base64"])
async def test_an_embedding_whose_values_are_not_numbers_is_a_502(
    gateway_factory: GatewayFactory,
    upstreams: Callable[[str], Awaitable[FakeUpstream]],
    caplog: pytest.LogCaptureFixture,
    kind: str,
    encoding: str,
) -> None:
    # Packed as float32 for base64, "a" raised TypeError (a 500 and a traceback); as floats it
    # was relayed to the client as given.
    caplog.set_level(logging.WARNING)
    up = await upstreams(kind)
    up.set_default(Reply(body=EMBEDDINGS[kind]))
    gw = await start_gateway(gateway_factory, _route(kind, up, TITAN))

    async with gw.http() as client:
        body = {"model": "m", "input": "a", "encoding_format": encoding}
        resp = await client.post("/v1/embeddings", json=body)

    assert resp.status_code == 502 and "invalid response" in resp.text, resp.text
    no_traceback(caplog)
