"""Prompt caching through the gateway: ``cache_control`` marks reach an ``anthropic`` route.

Claude caches only what a request marks, so a Messages client (the official ``anthropic``
SDK, as Claude Code calls it, marking its system prompt, tools and latest turn) must have its
marks reach Claude where it put them, and a chat client its LiteLLM-style marks on content
parts; an ``openai_compat`` route gets the request as before, without them (OpenAI refuses
fields it does not know). Against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}}
MARKED: dict[str, Any] = {
    "max_tokens": 50,
    "system": [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "A long, stable preamble.", "cache_control": EPHEMERAL},
    ],
    "tools": [{"name": "get_weather", "input_schema": SCHEMA, "cache_control": EPHEMERAL}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": HOUR}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, TOOL_USE]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "sunny",
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ],
}
CACHED_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude",
    "content": [{"type": "text", "text": "Sunny."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 900},
}


async def test_messages_cache_marks_reach_an_anthropic_route_where_the_client_put_them(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude = await fake_upstreams("claude")
    claude.enqueue(Reply(body=CACHED_ANSWER))
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))

    answer = await gw.anthropic().messages.create(
        model="m", **MARKED, extra_body={"cache_control": EPHEMERAL}
    )

    sent = claude.requests[-1].json
    assert sent["cache_control"] == EPHEMERAL
    assert sent["system"] == MARKED["system"]
    assert sent["tools"] == [{"name": "get_weather", "input_schema": SCHEMA, **_mark()}]
    first, _, last = sent["messages"]
    assert first["content"] == [{"type": "text", "text": "hi", "cache_control": HOUR}]
    assert last["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", **_mark()}
    ]
    assert answer.usage.cache_read_input_tokens == 900


async def test_chat_parts_cache_marks_reach_an_anthropic_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude = await fake_upstreams("claude")
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))
    marked = {"type": "text", "text": "A long, stable preamble.", "cache_control": EPHEMERAL}

    await gw.openai().chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": [marked]},
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": HOUR}]},
        ],
    )

    sent = claude.requests[-1].json
    assert sent["system"] == [marked]
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": HOUR}]}
    ]


async def test_messages_cache_marks_never_reach_an_openai_compat_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    up = await fake_upstreams("oa")
    gw = await gateway_factory(config(model("m", route(up))))

    await gw.anthropic().messages.create(
        model="m", **MARKED, extra_body={"cache_control": EPHEMERAL}
    )

    sent = up.requests[-1].json
    assert "cache_control" not in up.requests[-1].body.decode()
    assert [m["content"] for m in sent["messages"]] == [
        "You are terse.\n\nA long, stable preamble.",
        "hi",
        "ok",
        "sunny",
    ]


def _mark() -> dict[str, Any]:
    return {"cache_control": EPHEMERAL}
