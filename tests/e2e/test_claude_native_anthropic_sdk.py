"""What Claude Code relies on reaches Claude: ``is_error``, ``top_k``, Claude's stop reasons.

A Messages client (the official ``anthropic`` SDK, as Claude Code calls it) on an
``anthropic`` route has its tool results' ``is_error`` and its ``top_k`` sent to Claude as
it sent them, and sees Claude's own ``stop_reason`` (``pause_turn``, ``refusal``,
``model_context_window_exceeded``), plain and streamed; an ``openai_compat`` route gets
today's translation (an ``Error: `` prefix, no ``top_k``), and a chat client on the
``anthropic`` route keeps its finish reasons and never sees the private markers. Against the
scriptable fake upstream (and the fake Bedrock, whose Converse has
``model_context_window_exceeded`` of these), on the in-process bus.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, ONE_BUS, anthropic_route, config, model, route
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route
from tests.fixtures.upstream import Reply
from tests.fixtures.upstream_bedrock import FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
FAILED_TOOL: list[Any] = [
    {"role": "user", "content": "run it"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "x"}}],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True}
        ],
    },
]


def _answer(stop: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "Part."}],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }


def _sse(stop: str) -> bytes:
    start = {**_answer(stop), "content": [], "stop_reason": None}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "P"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


SSE_HEADERS = {"content-type": "text/event-stream"}


async def test_messages_is_error_and_top_k_reach_an_anthropic_route_only(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude, oa = await fake_upstreams("claude"), await fake_upstreams("oa")
    gw = await gateway_factory(config(model("m", anthropic_route(claude)), model("o", route(oa))))
    tools: Any = [{"name": "bash", "input_schema": SCHEMA}]

    for name in ("m", "o"):
        await gw.anthropic().messages.create(
            model=name,
            max_tokens=10,
            tools=tools,
            messages=FAILED_TOOL,
            extra_body={"top_k": 5},  # this SDK version types it no longer; the API takes it
        )

    sent = claude.requests[-1].json
    assert sent["top_k"] == 5
    assert sent["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True}
    ]
    chat = oa.requests[-1].json
    assert "top_k" not in chat
    assert not [key for key in chat if key.startswith("_")]
    assert chat["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "Error: boom",
    }


@pytest.mark.parametrize("stop", ["pause_turn", "refusal", "model_context_window_exceeded"])
async def test_messages_client_sees_claudes_own_stop_reason(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, stop: str
) -> None:
    claude = await fake_upstreams("claude")
    claude.enqueue(Reply(body=_answer(stop)))
    claude.enqueue(Reply(body=_sse(stop), headers=SSE_HEADERS))
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))
    client = gw.anthropic()

    answer = await client.messages.create(model="m", max_tokens=10, messages=HI)
    async with client.messages.stream(model="m", max_tokens=10, messages=HI) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()

    assert answer.stop_reason == stop
    [delta] = [event for event in events if event.type == "message_delta"]
    assert delta.delta.stop_reason == stop
    assert final.stop_reason == stop


async def test_chat_client_on_an_anthropic_route_keeps_its_finish_reason(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude = await fake_upstreams("claude")
    claude.enqueue(Reply(body=_answer("pause_turn")))
    claude.enqueue(Reply(body=_sse("refusal"), headers=SSE_HEADERS))
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))
    body = {"model": "m", "messages": HI}

    plain = await gw.http().post("/v1/chat/completions", json=body)
    async with gw.http().stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}
    ) as resp:
        raw = await resp.aread()

    assert plain.json()["choices"][0]["finish_reason"] == "stop"
    assert b"_claude" not in plain.content and b"_claude" not in raw
    assert b'"finish_reason":"content_filter"' in raw


async def test_messages_client_sees_claudes_window_stop_from_bedrock(
    gateway_factory: GatewayFactory,
) -> None:
    bedrock = FakeBedrock("bedrock1", chunks=2)
    await bedrock.start()
    try:
        bedrock.stop_reason = "model_context_window_exceeded"
        gw = await gateway_factory(config(model("m", bedrock_route(bedrock))))
        client = gw.anthropic()

        answer = await client.messages.create(model="m", max_tokens=10, messages=HI)
        async with client.messages.stream(model="m", max_tokens=10, messages=HI) as stream:
            final = await stream.get_final_message()
        chat = await gw.http().post("/v1/chat/completions", json={"model": "m", "messages": HI})
    finally:
        await bedrock.close()

    assert (answer.stop_reason, final.stop_reason) == ("model_context_window_exceeded",) * 2
    assert chat.json()["choices"][0]["finish_reason"] == "length"
    assert b"_claude" not in chat.content


CONTEXT_MANAGEMENT: Any = {"edits": [{"type": "clear_tool_uses_20250919"}]}


async def test_messages_context_management_reaches_an_anthropic_route_else_is_dropped(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    # Claude Code sends it with every request: a refusal on the other routes made whether a
    # request was answered depend on the route a draw or a failover picked.
    claude, oa = await fake_upstreams("claude"), await fake_upstreams("oa")
    gw = await gateway_factory(config(model("m", anthropic_route(claude)), model("o", route(oa))))
    client = gw.anthropic()
    ask: Any = {"max_tokens": 10, "messages": HI, "context_management": CONTEXT_MANAGEMENT}

    await client.beta.messages.create(model="m", **ask)
    answered = await client.beta.messages.create(model="o", **ask)

    assert claude.requests[-1].json["context_management"] == CONTEXT_MANAGEMENT
    assert answered.content
    assert "context_management" not in oa.requests[-1].json
