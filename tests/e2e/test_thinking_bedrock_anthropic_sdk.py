"""Claude's extended thinking through the gateway to a ``bedrock`` route (Converse), and back.

A Messages client (the official ``anthropic`` SDK) asking for ``thinking`` on a model whose
route is Claude on Bedrock gets Claude's signed thinking and redacted_thinking blocks, plain
and streamed (the stream accumulating to the plain answer), and sending them back in a
tool-use turn reaches Bedrock as ``reasoningContent`` first in that turn, which
:class:`FakeBedrock` (like Bedrock) requires while thinking is on, after checking every body
against botocore's service model.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, config, model
from tests.fixtures.upstream import Thinking, ToolCall
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

MODEL_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
THOUGHT = "The user wants the weather in Paris, so I call get_weather."
SIGNED = {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
REDACTED = {"type": "redacted_thinking", "data": base64.b64encode(b"redacted by Claude").decode()}
CLAUDE = Thinking((SIGNED, REDACTED), tool=ToolCall("get_weather", '{"city":"Paris"}', "tu_1"))
CONFIG = {"type": "enabled", "budget_tokens": 1024}
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
TOOL_USE = {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture
async def bedrock() -> AsyncIterator[FakeBedrock]:
    up = FakeBedrock("bedrock1", chunks=3)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


async def _claude(gateway_factory: GatewayFactory, up: FakeBedrock) -> RunningGateway:
    """A gateway whose model ``m`` is Claude on the Bedrock ``up``, thinking twice."""
    up.enqueue(CLAUDE, CLAUDE)
    route = {
        "kind": "bedrock",
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": MODEL_ID,
        "api_key": BEDROCK_KEY,
    }
    return await gateway_factory(config(model("m", route)))


async def test_a_messages_client_gets_claudes_signed_thinking_from_bedrock(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    # Before: Bedrock was never asked to think, and the answer held the tool_use block only.
    client = (await _claude(gateway_factory, bedrock)).anthropic()
    ask: dict[str, Any] = {"model": "m", "max_tokens": 2048, "messages": HI, "tools": TOOLS}

    plain = await client.messages.create(**ask, thinking=CONFIG)
    async with client.messages.stream(**ask, thinking=CONFIG) as stream:
        events = [e async for e in stream]
        streamed = await stream.get_final_message()

    sent = [r.json["additionalModelRequestFields"] for r in bedrock.requests]
    assert sent == [{"thinking": CONFIG}, {"thinking": CONFIG}]
    content = [b.model_dump(exclude_none=True) for b in plain.content]
    assert content == [SIGNED, REDACTED, TOOL_USE]
    assert [b.model_dump(exclude_none=True) for b in streamed.content] == content
    assert [e.signature for e in events if e.type == "signature"] == [SIGNED["signature"]]
    assert "".join(e.thinking for e in events if e.type == "thinking") == THOUGHT
    assert (streamed.stop_reason, plain.stop_reason) == ("tool_use", "tool_use")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_messages_client_sending_claudes_thinking_back_reaches_bedrock_first(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock, stream: bool
) -> None:
    # Before: the blocks were dropped, and Bedrock refused the tool-use turn (400).
    client = (await _claude(gateway_factory, bedrock)).anthropic()
    ask: dict[str, Any] = {"model": "m", "max_tokens": 2048, "tools": TOOLS, "thinking": CONFIG}
    if stream:
        async with client.messages.stream(**ask, messages=HI) as s:
            first = await s.get_final_message()
    else:
        first = await client.messages.create(**ask, messages=HI)

    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": "18C"}
    turn = [
        *HI,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    again = await client.messages.create(**ask, messages=turn)

    assert [b.type for b in again.content] == ["thinking", "redacted_thinking", "tool_use"]
    said = {"text": THOUGHT, "signature": SIGNED["signature"]}
    assert bedrock.requests[-1].json["messages"][1] == {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": said}},
            {"reasoningContent": {"redactedContent": REDACTED["data"]}},
            {"toolUse": {"toolUseId": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}},
        ],
    }
