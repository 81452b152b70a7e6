"""Every client surface against every upstream kind, through the official SDKs.

3 surfaces (chat and responses via the openai SDK, messages via the anthropic SDK) x 2
upstream kinds (``openai_compat`` and ``anthropic`` fake upstreams) x {plain, stream, tools}:
the text, tool call ids/names/arguments, stop reasons, usage (cached tokens included) and
``x-routed-via`` survive translation both ways, and the upstream receives the system prompt,
history, tools and sampling parameters in its own dialect. A stream cut mid-answer ends in
each surface's own error form, never as a clean finish. Runs on ``inproc://`` and on NATS.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e._surface_clients import (
    DRIVERS,
    MAX_TOKENS,
    PREV_ARGS,
    PREV_CALL,
    PREV_RESULT,
    QUESTION,
    SYSTEM,
    TEMPERATURE,
    TOOL_NAME,
    TOOL_SCHEMA,
    Answer,
)
from tests.e2e.conftest import HI, ONE_BUS, anthropic_route, config, eid, model, route
from tests.fixtures.upstream import (
    FakeUpstream,
    Recorded,
    Reply,
    Stream,
    ToolCall,
    UpstreamFactory,
)

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

SURFACES = ("chat", "responses", "messages")
KINDS = {"openai_compat": route, "anthropic": anthropic_route}
ROUTE_KEY = "sk-route-secret"
NEW_CALL = "call_new1"
NEW_ARGS = '{"city":"Paris","unit":"c"}'
# usage the fake reports: 10 prompt tokens of which 4 cached, 5 completion tokens
USAGE = (10, 5, 4)


async def _serve(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str, **upstream: Any
) -> tuple[Any, FakeUpstream]:
    up = await fake_upstreams("up1", cached_tokens=USAGE[2], chunks=4, **upstream)
    gw = await gateway_factory(config(model("m", KINDS[kind](up, api_key=ROUTE_KEY))))
    return gw, up


def _assert_upstream_saw(rec: Recorded, kind: str, *, tools: bool, stream: bool) -> None:
    body = rec.json
    assert rec.model == "up1-model"
    assert body["temperature"] == TEMPERATURE and body["max_tokens"] == MAX_TOKENS
    assert bool(body.get("stream")) is stream
    msgs = body["messages"]
    if kind == "openai_compat":
        assert rec.path == "/v1/chat/completions"
        assert rec.headers["authorization"] == f"Bearer {ROUTE_KEY}"
        assert msgs[:2] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        if stream:
            assert body["stream_options"] == {"include_usage": True}
        if tools:
            (call,) = msgs[2]["tool_calls"]
            assert (msgs[2]["role"], call["id"], call["function"]["name"]) == (
                "assistant",
                PREV_CALL,
                TOOL_NAME,
            )
            assert json.loads(call["function"]["arguments"]) == PREV_ARGS
            assert msgs[3] == {"role": "tool", "tool_call_id": PREV_CALL, "content": PREV_RESULT}
            (tool,) = body["tools"]
            assert tool["function"]["name"] == TOOL_NAME
            assert tool["function"]["parameters"] == TOOL_SCHEMA
        return
    assert rec.path == "/v1/messages"
    assert rec.headers["x-api-key"] == ROUTE_KEY
    assert rec.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in rec.headers
    assert body["system"] == SYSTEM
    assert msgs[0] == {"role": "user", "content": [{"type": "text", "text": QUESTION}]}
    if tools:
        assert msgs[1:] == [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": PREV_CALL, "name": TOOL_NAME, "input": PREV_ARGS}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": PREV_CALL, "content": PREV_RESULT}
                ],
            },
        ]
        (tool,) = body["tools"]
        assert (tool["name"], tool["input_schema"]) == (TOOL_NAME, TOOL_SCHEMA)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", SURFACES)
async def test_plain_answer_keeps_text_stop_reason_usage_and_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    kind: str,
) -> None:
    gw, up = await _serve(gateway_factory, fake_upstreams, kind)
    driver = DRIVERS[surface](gw)

    got = await driver.plain()

    assert got == Answer(up.text, driver.stops[0], USAGE, routed_via=eid("m", up))
    _assert_upstream_saw(up.requests[-1], kind, tools=False, stream=False)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", SURFACES)
async def test_stream_delivers_text_deltas_in_order_then_a_clean_finish_with_usage(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    kind: str,
) -> None:
    gw, up = await _serve(gateway_factory, fake_upstreams, kind)
    driver = DRIVERS[surface](gw)

    got = await driver.stream()

    assert len(got.deltas) == 4 and "".join(got.deltas) == up.text
    assert (got.text, got.stop, got.usage, got.calls) == (up.text, driver.stops[0], USAGE, [])
    assert got.routed_via == eid("m", up)
    _assert_upstream_saw(up.requests[-1], kind, tools=False, stream=True)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", SURFACES)
async def test_tool_calls_round_trip_ids_names_and_arguments_plain_and_streamed(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    kind: str,
) -> None:
    gw, up = await _serve(gateway_factory, fake_upstreams, kind)
    up.set_default(ToolCall(TOOL_NAME, NEW_ARGS, call_id=NEW_CALL))
    driver = DRIVERS[surface](gw)

    plain = await driver.plain(tools=True)
    streamed = await driver.stream(tools=True)

    for got in (plain, streamed):
        assert got.calls == [(NEW_CALL, TOOL_NAME, NEW_ARGS)]
        assert (got.text, got.stop, got.usage) == ("", driver.stops[1], USAGE)
        assert got.routed_via == eid("m", up)
    assert len(streamed.deltas) > 1 and "".join(streamed.deltas) == NEW_ARGS
    _assert_upstream_saw(up.requests[0], kind, tools=True, stream=False)
    _assert_upstream_saw(up.requests[1], kind, tools=True, stream=True)


_RAW_STREAM: dict[str, tuple[str, dict[str, Any], str, str]] = {
    # surface: (path, body, how the stream must end, what must never appear)
    "chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        'data: {"error":',
        "[DONE]",
    ),
    "responses": (
        "/v1/responses",
        {"model": "m", "input": "hi", "stream": True},
        "event: response.failed",
        "response.completed",
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        "event: error",
        "message_stop",
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", SURFACES)
async def test_stream_cut_mid_answer_ends_in_the_surface_error_form_never_a_clean_finish(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    kind: str,
) -> None:
    gw, up = await _serve(gateway_factory, fake_upstreams, kind, default=Stream(cut_after=1))
    driver = DRIVERS[surface](gw)

    got, error = await driver.cut()

    assert got and up.text.startswith(got) and got != up.text
    assert "upstream stream broke" in error
    path, body, last, never = _RAW_STREAM[surface]
    async with gw.http().stream("POST", path, json=body) as resp:
        assert resp.status_code == 200
        raw = (await resp.aread()).decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert frames[-1].startswith(last), frames[-1]
    assert never not in raw
    assert len(up.requests) == 2  # committed after the first chunk: never retried elsewhere


def _chat_answer(finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "x",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "logprobs": None,
                "message": {"role": "assistant", "content": "cut"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def _anthropic_answer(stop: str, sequence: str | None = None) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "x",
        "content": [{"type": "text", "text": "cut"}],
        "stop_reason": stop,
        "stop_sequence": sequence,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }


async def test_stop_reasons_map_between_the_dialects(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    oa, an = await fake_upstreams("oa"), await fake_upstreams("an")
    gw = await gateway_factory(config(model("oa", route(oa)), model("an", anthropic_route(an))))
    oa.enqueue(Reply(body=_chat_answer("length")), Reply(body=_chat_answer("length")))
    an.enqueue(
        Reply(body=_anthropic_answer("max_tokens")),
        Reply(body=_anthropic_answer("stop_sequence", "END")),
    )
    openai_client, anthropic_client = gw.openai(), gw.anthropic()

    cut_message = await anthropic_client.messages.create(model="oa", max_tokens=1, messages=HI)
    cut_response = await openai_client.responses.create(model="oa", input="hi")
    cut_chat = await openai_client.chat.completions.create(model="an", messages=HI)
    stopped = await anthropic_client.messages.create(
        model="an", max_tokens=9, messages=HI, stop_sequences=["END"]
    )

    assert cut_message.stop_reason == "max_tokens"
    assert cut_response.status == "incomplete"
    assert cut_response.incomplete_details is not None
    assert cut_response.incomplete_details.reason == "max_output_tokens"
    assert cut_chat.choices[0].finish_reason == "length"
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    assert an.requests[1].json["stop_sequences"] == ["END"]


PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
IMAGE_URL = "https://example.com/cat.png"


async def test_images_cross_dialects_as_url_and_base64(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    oa, an = await fake_upstreams("oa"), await fake_upstreams("an")
    vision: dict[str, Any] = {"input_modalities": ["text", "image"]}
    gw = await gateway_factory(
        config(model("oa", route(oa, **vision)), model("an", anthropic_route(an, **vision)))
    )

    await gw.anthropic().messages.create(
        model="oa",
        max_tokens=5,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                    },
                    {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
                ],
            }
        ],
    )
    await gw.openai().chat.completions.create(
        model="an",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
                    {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                ],
            }
        ],
    )

    assert oa.requests[0].json["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
        {"type": "image_url", "image_url": {"url": IMAGE_URL}},
    ]
    assert an.requests[0].json["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
        {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
    ]
