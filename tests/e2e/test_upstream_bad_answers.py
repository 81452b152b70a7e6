"""An upstream's misshapen answer is the upstream's bad response, on every surface.

Usage whose counts are not sane (``10**30``, ``"a"``, ``-5``, null) is unknown: the answer
still reaches the client, and its request log row is written (the store once crash-looped on
a count SQLite cannot hold). Malformed ``choices`` or tool-call deltas in a stream, or an
``anthropic`` upstream's event whose parts are not the Messages API's (a string where an
object belongs, a list as a block index), are a 502 before the first byte (another route is
tried) and the dialect's stream error after it: never a 500, a logged traceback or a torn
connection; so is an SSE event that outgrows the parser's bound. Raw httpx on loopback,
against a scripted fake upstream (or one writing raw bytes).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.sse import MAX_EVENT_BYTES
from tests.e2e.bad_answers_support import (
    ADMIN,
    PATHS,
    SSE,
    TINY,
    ended_cleanly,
    ended_in_error,
    no_traceback,
    post,
    start_gateway,
    surface_request,
)
from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.raw_upstream import RawUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

BASE = {"id": "chatcmpl-1", "created": 1, "model": "x"}
HUGE = '{"prompt_tokens": 1000000000000000000000000000000, "completion_tokens": 2}'
NONSENSE = '{"prompt_tokens": "a", "completion_tokens": -5, "total_tokens": null}'


def _answer(usage: str) -> Reply:
    message = {"role": "assistant", "content": "fine"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = json.dumps({**BASE, "object": "chat.completion", "choices": [choice]})
    body = body[:-1] + f', "usage": {usage}}}'
    return Reply(body=body, headers={"content-type": "application/json"})


def _sse(*events: str) -> Reply:
    return Reply(body="".join(f"data: {e}\n\n" for e in events), headers=SSE)


def _chunk(delta: Any, finish: str | None = None, index: Any = 0) -> str:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return json.dumps({**BASE, "object": "chat.completion.chunk", "choices": [choice]})


NOT_ASKED: dict[str, Any] = {"str": "zero", "negative": -1, "huge": 10**12}
OPENING = _chunk({"role": "assistant", "content": "Hel"})
CLOSING = (_chunk({}, "stop"), "[DONE]")
BAD_CHOICES = ('{"choices":[{"delta":"x"}]}', '{"choices":"x"}')
BAD_TOOL_CALL = _chunk(
    {"tool_calls": [{"index": "a", "id": 5, "function": {"name": None, "arguments": 5}}]}
)


@pytest.mark.parametrize("usage", [HUGE, NONSENSE], ids=["huge", "nonsense"])
@pytest.mark.parametrize("surface", list(PATHS))
async def test_insane_usage_is_unknown_and_the_answer_and_its_log_row_land(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, usage: str
) -> None:
    gw = await start_gateway(gateway_factory, route(fake_upstream))
    fake_upstream.enqueue(_answer(usage))
    status, body = await post(gw, surface, stream=False)
    assert status == 200, body
    assert "fine" in body

    admin = gw.http(headers={"authorization": f"Bearer {ADMIN}"})
    rows = (await admin.post("/admin/log/query", json={"kind": "request"})).json()["rows"]
    # Unknown usage: the row is priced on the gateway's estimate of the prompt, and says so.
    assert [(r["status"], r["cost_estimated"]) for r in rows] == [(200, True)]
    assert 0 < rows[0]["prompt_tokens"] < 1000
    stats = (await admin.post("/admin/log/stats", json={})).json()
    assert stats["refused_write_failed"] == 0, stats


@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_stream_with_insane_usage_ends_cleanly(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str
) -> None:
    gw = await start_gateway(gateway_factory, route(fake_upstream))
    usage = json.dumps({**BASE, "choices": [], "usage": {"prompt_tokens": "x"}})
    fake_upstream.enqueue(_sse(OPENING, CLOSING[0], usage, CLOSING[1]))
    status, body = await post(gw, surface, stream=True)
    assert status == 200 and ended_cleanly(surface, body), body


# A stream for one choice has only choice 0: the Responses and Messages renderers dropped
# any other, so its content was lost from a "completed" answer (chat clients got it).
BAD_INDEX = {i: _chunk({"content": "Hel"}, "stop", index) for i, index in NOT_ASKED.items()}
# An index no dict can be keyed by: numbering the calls was a TypeError (a 500, no failover).
UNHASHABLE = {
    "call index list": _chunk({"tool_calls": [{"index": [0], "function": {"arguments": "{}"}}]}),
    "choice index object": _chunk({"tool_calls": [{"index": 0, "id": "c"}]}, index={}),
}
FIRST = pytest.mark.parametrize(
    "bad",
    [*BAD_CHOICES, BAD_TOOL_CALL, *BAD_INDEX.values(), *UNHASHABLE.values()],
    ids=["delta", "choices", "tool", *(f"index {i}" for i in BAD_INDEX), *UNHASHABLE],
)


@FIRST
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_first_chunk_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, bad: str
) -> None:
    gw = await start_gateway(gateway_factory, route(fake_upstream))
    fake_upstream.set_default(_sse(bad, *CLOSING))
    status, body = await post(gw, surface, stream=True)
    assert status == 502 and "invalid response" in body, body
    assert ('"type":"error"' in body) == (surface == "messages"), body


@FIRST
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_first_chunk_fails_over_to_the_next_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str, bad: str
) -> None:
    evil, good = await fake_upstreams("evil"), await fake_upstreams("good")
    evil.set_default(_sse(bad, *CLOSING))
    gw = await start_gateway(gateway_factory, route(evil), route(good, TINY))
    status, body = await post(gw, surface, stream=True)
    assert status == 200 and ended_cleanly(surface, body), body
    assert len(evil.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize(
    "bad",
    [BAD_CHOICES[1], BAD_TOOL_CALL, BAD_INDEX["str"], UNHASHABLE["call index list"]],
    ids=["choices", "tool", "index", "call index list"],
)
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_chunk_mid_stream_ends_in_the_dialect_stream_error(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, bad: str
) -> None:
    gw = await start_gateway(gateway_factory, route(fake_upstream))
    fake_upstream.set_default(_sse(OPENING, bad, *CLOSING))
    status, body = await post(gw, surface, stream=True)
    assert status == 200 and "Hel" in body, body
    assert ended_in_error(surface, body), body
    assert "invalid response" in body, body


@pytest.mark.parametrize(
    "calls", [[{"id": "c", "function": "x"}], 5, [{"id": 5}]], ids=["function", "list", "id"]
)
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_whole_answer_with_malformed_tool_calls_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, calls: Any
) -> None:
    # Only the message's being an object was checked: the Messages renderer then failed on
    # a tool call whose function was a string (a 500), the accounting on tool_calls: 5.
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    body = json.dumps({**BASE, "object": "chat.completion", "choices": [choice]})
    fake_upstream.set_default(Reply(body=body, headers={"content-type": "application/json"}))
    gw = await start_gateway(gateway_factory, route(fake_upstream))

    status, text = await post(gw, surface, stream=False)

    assert status == 502 and "invalid response" in text, text
    assert ('"type":"error"' in text) == (surface == "messages"), text


@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_chunk_choice_without_a_delta_carries_nothing_and_the_stream_ends_cleanly(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str
) -> None:
    # Azure's asynchronous content filter sends choices with no delta (the openai SDK reads
    # it as None): nothing of the answer, on every surface alike, and no bad response.
    annotation = json.dumps({**BASE, "choices": [{"index": 0, "delta": None}]})
    fake_upstream.set_default(_sse(OPENING, annotation, *CLOSING))
    gw = await start_gateway(gateway_factory, route(fake_upstream))

    status, body = await post(gw, surface, stream=True)

    assert status == 200 and "Hel" in body and ended_cleanly(surface, body), body


@pytest.mark.parametrize("message", ["hello", 5, ["ab"]], ids=["str", "int", "list"])
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_whole_answer_to_a_stream_whose_message_is_no_object_is_a_502(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, message: Any
) -> None:
    # A server that ignores ``stream`` answers whole; its message was copied with dict(): a
    # string or a number was a 500, ``["ab"]`` the delta {"a": "b"} and an empty answer.
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = json.dumps({**BASE, "object": "chat.completion", "choices": [choice]})
    fake_upstream.set_default(Reply(body=body, headers={"content-type": "application/json"}))
    gw = await start_gateway(gateway_factory, route(fake_upstream))

    status, text = await post(gw, surface, stream=True)

    assert status == 502 and "'message' is not an object" in text, text


NO_CHOICE = {
    "empty choices": [],
    "null message": [{"index": 0, "message": None, "finish_reason": "stop"}],
    "index not asked": [{"index": 1, "message": {"content": "a"}, "finish_reason": "stop"}],
}


@pytest.mark.parametrize("choices", NO_CHOICE.values(), ids=NO_CHOICE.keys())
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_whole_answer_with_no_choice_to_show_is_a_502_on_every_surface(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, choices: Any
) -> None:
    # Chat clients were relayed these as a 200 with nothing to read; Responses and Messages
    # clients got a 502 (the OpenAI API answers one choice per n, each with its message).
    body = json.dumps({**BASE, "object": "chat.completion", "choices": choices})
    fake_upstream.set_default(Reply(body=body, headers={"content-type": "application/json"}))
    gw = await start_gateway(gateway_factory, route(fake_upstream))

    status, text = await post(gw, surface, stream=False)

    assert status == 502 and "invalid response" in text, text
    assert ('"type":"error"' in text) == (surface == "messages"), text


async def test_a_count_an_anthropic_upstream_gives_that_is_not_a_number_leaves_usage_unknown(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # The adapter summed the provider's counts into the chat shape: "a" + 0 failed the
    # answer with a 500 before the seam could judge them.
    text = [{"type": "text", "text": "fine"}]
    message = {"content": text, "usage": {"input_tokens": "a", "output_tokens": 2}}
    json_type = {"content-type": "application/json"}
    fake_upstream.enqueue(Reply(body=json.dumps(message), headers=json_type))
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream))))

    async with gw.http() as client:
        resp = await client.post(PATHS["chat"], json=surface_request("chat", False))

    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "fine"


# -- an anthropic upstream's events and answers ------------------------------------------------


def _anthropic_sse(*events: dict[str, Any]) -> Reply:
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    return Reply(body=body, headers=SSE)


AN_OPENING: tuple[dict[str, Any], ...] = (
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
)
AN_CLOSING: tuple[dict[str, Any], ...] = (
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
)
_TOOL = {"type": "tool_use", "id": "toolu_1", "name": "f"}
AN_BAD: dict[str, dict[str, Any]] = {
    "message": {"type": "message_start", "message": "str"},
    "block": {"type": "content_block_start", "index": 1, "content_block": "str"},
    "delta": {"type": "content_block_delta", "index": 0, "delta": "str"},
    "index": {"type": "content_block_start", "index": [1], "content_block": _TOOL},
    "error": {"type": "error", "error": "str"},
    "stop_reason": {"type": "message_delta", "delta": {"stop_reason": 5}},
    # A call's arguments for a block never started: dropped, the answer ended "tool_calls"
    # with no call in it.
    "unstarted call": {
        "type": "content_block_delta",
        "index": 5,
        "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'},
    },
}
AN_FIRST = pytest.mark.parametrize("bad", AN_BAD.values(), ids=AN_BAD.keys())


@pytest.mark.parametrize("count", [10**30, 10**12 + 1], ids=["past int64", "past MAX_TOKENS"])
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_stream_start_with_an_absurd_count_leaves_usage_unknown(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, count: int
) -> None:
    # A stream's start was read before any seam judged its counts: a cut stream was billed on
    # them (10**30 tokens: its log rows refused, lost; 10**12 + 1 written into the spend), and
    # a Messages client's message_start showed them.
    start = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": count}}}
    fake_upstream.set_default(_anthropic_sse(start, *AN_OPENING[1:]))
    gw = await start_gateway(gateway_factory, anthropic_route(fake_upstream))

    status, body = await post(gw, surface, stream=True)

    assert status == 200 and ended_in_error(surface, body), body
    assert str(count) not in body
    admin = gw.http(headers={"authorization": f"Bearer {ADMIN}"})
    rows = (await admin.post("/admin/log/query", json={"kind": "request"})).json()["rows"]
    assert len(rows) == 1 and 0 < rows[0]["prompt_tokens"] < 1000, rows
    assert rows[0]["cost_estimated"] is True


@AN_FIRST
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_anthropic_event_before_the_first_chunk_is_a_502(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    surface: str,
    bad: dict[str, Any],
) -> None:
    # A string where an object belongs raised AttributeError in the translation: a 500
    # "internal gateway error" and a logged traceback.
    caplog.set_level(logging.WARNING)
    fake_upstream.set_default(_anthropic_sse(bad, *AN_OPENING, *AN_CLOSING))
    gw = await start_gateway(gateway_factory, anthropic_route(fake_upstream))

    status, body = await post(gw, surface, stream=True)

    assert status == 502 and "invalid response" in body, body
    assert ('"type":"error"' in body) == (surface == "messages"), body
    no_traceback(caplog)


@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_anthropic_event_before_the_first_chunk_fails_over(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str
) -> None:
    evil, good = await fake_upstreams("evil"), await fake_upstreams("good")
    evil.set_default(_anthropic_sse(AN_BAD["delta"], *AN_OPENING, *AN_CLOSING))
    gw = await start_gateway(gateway_factory, anthropic_route(evil), route(good, TINY))

    status, body = await post(gw, surface, stream=True)

    assert status == 200 and ended_cleanly(surface, body), body
    assert len(evil.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize(
    "bad",
    [v for k, v in AN_BAD.items() if k != "message"],
    ids=[k for k in AN_BAD if k != "message"],
)
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_anthropic_event_mid_stream_ends_in_the_dialect_stream_error(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    surface: str,
    bad: dict[str, Any],
) -> None:
    # The same AttributeError after the first chunk tore the connection mid-body: the
    # client read an incomplete chunked body and no error event.
    caplog.set_level(logging.WARNING)
    fake_upstream.set_default(_anthropic_sse(*AN_OPENING, bad, *AN_CLOSING))
    gw = await start_gateway(gateway_factory, anthropic_route(fake_upstream))

    status, body = await post(gw, surface, stream=True)

    assert status == 200 and "Hel" in body, body
    assert ended_in_error(surface, body), body
    assert "invalid response" in body, body
    no_traceback(caplog)


AN_BAD_ANSWERS = {
    "text int": [{"type": "text", "text": 5}],
    "block str": ["hello", {"type": "text", "text": "a"}],
    "tool input str": [{**_TOOL, "input": "str"}],
}


@pytest.mark.parametrize("content", AN_BAD_ANSWERS.values(), ids=AN_BAD_ANSWERS.keys())
@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_malformed_anthropic_answer_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    surface: str,
    content: list[Any],
) -> None:
    # A text of 5 failed "".join (a 500 and a traceback); a block that was not an object was
    # skipped, its text silently lost from a 200.
    caplog.set_level(logging.WARNING)
    message = {"id": "msg_1", "content": content, "stop_reason": "end_turn"}
    json_type = {"content-type": "application/json"}
    fake_upstream.set_default(Reply(body=json.dumps(message), headers=json_type))
    gw = await start_gateway(gateway_factory, anthropic_route(fake_upstream))

    status, text = await post(gw, surface, stream=False)

    assert status == 502 and "invalid response" in text, text
    assert ('"type":"error"' in text) == (surface == "messages"), text
    no_traceback(caplog)


@pytest.mark.parametrize(
    ("kind", "opening"),
    [
        ("openai_compat", b""),
        ("anthropic", b""),
        ("openai_compat", b"data: %s\n\n" % OPENING.encode()),
    ],
    ids=["first", "anthropic-first", "mid-stream"],
)
async def test_an_event_past_the_sse_bound_is_a_bad_response_not_a_wait(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream, kind: str, opening: bytes
) -> None:
    # An upstream whose line never ends, and whose answer never completes either: the
    # attempt ends once the event outgrows the bound, not at the route's timeout (the whole
    # pending line was copied and split again on every read: seconds of a blocked loop).
    body = opening + b"data: " + b"y" * MAX_EVENT_BYTES
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
    raw_upstream.enqueue(head % (len(body) + 1) + body)
    path = "/v1" if kind == "openai_compat" else ""  # the Anthropic adapter adds /v1 itself
    raw_route = {
        "kind": kind,
        "base_url": f"http://127.0.0.1:{raw_upstream.port}{path}",
        "provider_model_id": "raw-model",
        "timeout_seconds": 5,  # far below the client's: without the bound, the attempt's end
    }
    gw = await start_gateway(gateway_factory, raw_route)

    status, text = await post(gw, "chat", stream=True)

    assert "invalid response" in text and str(MAX_EVENT_BYTES) in text, text[:500]
    if opening:
        assert status == 200 and "Hel" in text and ended_in_error("chat", text), text[:500]
    else:
        assert status == 502 and json.loads(text)["error"]["code"] == "upstream_bad_response"


@pytest.mark.parametrize("surface", list(PATHS))
async def test_a_stream_framed_with_cr_alone_is_read_as_one_framed_with_lf(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str
) -> None:
    # SSE lets a line end with CR alone: such a stream was read as one endless line, and
    # failed as "ended before [DONE]".
    gw = await start_gateway(gateway_factory, route(fake_upstream))
    frames = "".join(f"data: {e}\r\r" for e in (OPENING, *CLOSING))
    fake_upstream.set_default(Reply(body=frames, headers=SSE))
    status, body = await post(gw, surface, stream=True)
    assert status == 200 and "Hel" in body and ended_cleanly(surface, body), body


DEEP = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("kind", ["openai_compat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize("surface", list(PATHS))
async def test_an_answer_nested_past_the_decode_is_the_upstreams_and_fails_over(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    stream: bool,
    kind: str,
) -> None:
    # The decode's RecursionError read as the request's (dispatch takes one for a body it
    # could not encode again): a 400 "the request body is JSON nested too deeply" to the
    # caller, and the next route never tried.
    evil, good = await fake_upstreams("evil"), await fake_upstreams("good")
    anthropic = kind == "anthropic"
    if stream:
        start = 'event: message_start\ndata: {"type": "message_start", "message": '
        body = (start + DEEP + "}" if anthropic else "data: " + DEEP) + "\n\n"
        evil.set_default(Reply(body=body, headers=SSE))
    else:
        evil.set_default(Reply(body=DEEP, headers={"content-type": "application/json"}))
    first = anthropic_route(evil) if anthropic else route(evil)
    gw = await start_gateway(gateway_factory, first, route(good, TINY))

    status, text = await post(gw, surface, stream=stream)

    assert status == 200, text
    assert len(evil.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize("surface", list(PATHS))
async def test_an_error_answer_nested_past_the_decode_fails_over(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str
) -> None:
    evil, good = await fake_upstreams("evil"), await fake_upstreams("good")
    evil.set_default(Reply(503, body=DEEP, headers={"content-type": "application/json"}))
    gw = await start_gateway(gateway_factory, route(evil), route(good, TINY))

    status, text = await post(gw, surface, stream=False)

    assert status == 200, text
    assert len(evil.requests) == 1 and len(good.requests) == 1
