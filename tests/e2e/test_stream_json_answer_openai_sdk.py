"""A stream request an OpenAI-compatible server answers with plain JSON is relayed as a stream.

Some OpenAI-compatible servers ignore ``stream: true`` and answer ``200 application/json``
with the whole chat completion; the client asked for a stream and gets one equivalent to
that answer (role, content, tool calls, finish reason, usage) instead of a 502 "ended before
[DONE]". Through the official ``openai`` and ``anthropic`` SDKs, against the scriptable fake
upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

HI: Any = [{"role": "user", "content": "weather in Paris?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
USAGE = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "up",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": USAGE,
}


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON; charset=utf-8"], ids=["lower", "mixed"]
)
async def test_chat_stream_answered_as_json_reaches_the_client_as_its_chunks(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, content_type: str
) -> None:
    # A media type is case-insensitive: ``Application/JSON`` was read as SSE, a 502 "empty".
    oa = await fake_upstreams("oa")
    oa.enqueue(Reply(body=ANSWER, headers={"content-type": content_type}))
    gw = await gateway_factory(config(model("m", route(oa))))

    stream = await gw.openai().chat.completions.create(
        model="m", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "Checking."
    [call] = [call for d in deltas for call in d.tool_calls or ()]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "get_weather",
        '{"city":"Paris"}',
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    [usage] = [c.usage for c in chunks if c.usage is not None]
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 4)


async def test_messages_stream_answered_as_json_on_an_openai_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    oa = await fake_upstreams("oa")
    oa.enqueue(Reply(body=ANSWER))
    gw = await gateway_factory(config(model("m", route(oa))))

    async with gw.anthropic().messages.stream(model="m", max_tokens=50, messages=HI) as stream:
        final = await stream.get_final_message()

    assert final.stop_reason == "tool_use"
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}
    assert final.usage.output_tokens == 4
