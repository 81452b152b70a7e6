"""A stream from an ``anthropic`` route tells a Messages client its input and cache tokens at
its start, as Claude does; a chat client's usage stays the one chunk at the end.

Clients (Claude Code among them) read ``input_tokens`` and the cache counts from
``message_start`` and only ``output_tokens`` from the final ``message_delta``. Through the
official SDKs, against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import HI, ONE_BUS, anthropic_route, config, model

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]


async def test_messages_stream_start_carries_claudes_input_and_cache_tokens(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude = await fake_upstreams("claude", prompt_tokens=1000, cached_tokens=900)
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))

    async with gw.anthropic().messages.stream(model="m", max_tokens=50, messages=HI) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()

    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.input_tokens == 100
    assert start.message.usage.cache_read_input_tokens == 900
    assert start.message.usage.output_tokens == 0
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (100, 900)
    assert final.usage.output_tokens == 5


async def test_chat_stream_from_an_anthropic_route_reports_its_prompt_once(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude = await fake_upstreams("claude", prompt_tokens=1000, cached_tokens=900)
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))
    body = {"model": "m", "messages": HI, "stream": True}

    async with gw.http().stream("POST", "/v1/chat/completions", json=body) as resp:
        raw = await resp.aread()
    chunks = await gw.openai().chat.completions.create(
        model="m", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    with_usage = [chunk.usage async for chunk in chunks if chunk.usage is not None]

    assert b"_start_usage" not in raw
    assert b'"usage"' not in raw
    [usage] = with_usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (1000, 5)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 900


async def test_messages_stream_keeps_claudes_message_id_as_the_plain_answer_does(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    # The streamed message had an id of the gateway's own making, so a client could not
    # match it to Claude's (its logs, its support requests) as it can a plain answer's.
    claude = await fake_upstreams("claude")
    gw = await gateway_factory(config(model("m", anthropic_route(claude))))
    client = gw.anthropic()

    plain = await client.messages.create(model="m", max_tokens=50, messages=HI)
    async with client.messages.stream(model="m", max_tokens=50, messages=HI) as stream:
        streamed = await stream.get_final_message()

    first, second = claude.requests
    assert plain.id == f"msg_claude-{first.seq}"
    assert streamed.id == f"msg_claude-{second.seq}"
