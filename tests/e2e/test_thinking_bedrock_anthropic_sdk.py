"""Claude's extended thinking through the gateway to a ``bedrock`` route (Converse), and back.

A Messages client (the official ``anthropic`` SDK) asking for ``thinking`` on a model whose
route is Claude on Bedrock (by its model id, or an application inference profile's ARN with
``bedrock.model_family: anthropic``) gets Claude's signed thinking and redacted_thinking
blocks, plain and streamed (the stream accumulating to the plain answer), and sending them
back in a
tool-use turn reaches Bedrock as ``reasoningContent`` first in that turn, which
:class:`FakeBedrock` (like Bedrock) requires while thinking is on, after checking every body
against botocore's service model.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, anthropic_route, config, model
from tests.fixtures.upstream import Thinking, ToolCall
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

MODEL_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"
THOUGHT = "The user wants the weather in Paris, so I call get_weather."
SIGNED = {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
REDACTED = {"type": "redacted_thinking", "data": base64.b64encode(b"redacted by Claude").decode()}
CLAUDE = Thinking((SIGNED, REDACTED), tool=ToolCall("get_weather", '{"city":"Paris"}', "tu_1"))
CONFIG = {"type": "enabled", "budget_tokens": 1024}
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
TOOL_USE = {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture
async def bedrock() -> AsyncIterator[FakeBedrock]:
    up = FakeBedrock("bedrock1", chunks=3, profiles={APP_PROFILE: MODEL_ID})
    await up.start()
    try:
        yield up
    finally:
        await up.close()


async def _claude(
    gateway_factory: GatewayFactory, up: FakeBedrock, settings: dict[str, str] | None = None
) -> RunningGateway:
    """A gateway whose model ``m`` is Claude on the Bedrock ``up``, thinking twice
    (``settings``: the route's ``bedrock:`` settings besides the region)."""
    up.enqueue(CLAUDE, CLAUDE)
    route = {
        "kind": "bedrock",
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION, **(settings or {})},
        "provider_model_id": APP_PROFILE if settings else MODEL_ID,
        "api_key": BEDROCK_KEY,
    }
    return await gateway_factory(config(model("m", route)))


@pytest.mark.parametrize(
    "settings",
    [None, {"model_family": "anthropic"}],
    ids=["claude_model_id", "application_inference_profile"],
)
async def test_a_messages_client_gets_claudes_signed_thinking_from_bedrock(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock, settings: dict[str, str] | None
) -> None:
    # Before: Bedrock was never asked to think, and the answer held the tool_use block only;
    # so it stayed for an application inference profile's ARN, which does not show Claude,
    # until its route said model_family: anthropic.
    client = (await _claude(gateway_factory, bedrock, settings)).anthropic()
    ask: dict[str, Any] = {"model": "m", "max_tokens": 2048, "messages": HI, "tools": TOOLS}

    plain = await client.messages.create(**ask, thinking=CONFIG)
    async with client.messages.stream(**ask, thinking=CONFIG) as stream:
        events = [e async for e in stream]
        streamed = await stream.get_final_message()

    sent = [r.json["additionalModelRequestFields"] for r in bedrock.requests]
    assert sent == [{"thinking": CONFIG}, {"thinking": CONFIG}]
    assert {r.model for r in bedrock.requests} == {APP_PROFILE if settings else MODEL_ID}
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


async def _claude_of(
    kind: str, gateway_factory: GatewayFactory, bedrock: FakeBedrock, fake_upstream: FakeUpstream
) -> RunningGateway:
    """A gateway whose model ``m`` is Claude on a ``bedrock`` route or an ``anthropic`` one."""
    if kind == "bedrock":
        return await _claude(gateway_factory, bedrock)
    return await gateway_factory(config(model("m", anthropic_route(fake_upstream))))


def _thinking_sent(kind: str, bedrock: FakeBedrock, fake_upstream: FakeUpstream) -> list[Any]:
    """What the last two requests asked Claude to think (None: nothing), by route kind."""
    if kind == "bedrock":
        return [r.json.get("additionalModelRequestFields") for r in bedrock.requests[-2:]]
    return [
        r.json.get("thinking") and {"thinking": r.json["thinking"]} for r in fake_upstream.requests
    ]


@pytest.mark.parametrize("kind", ["bedrock", "anthropic"])
async def test_a_reasoning_effort_in_a_tool_loop_without_claudes_blocks_is_answered(
    gateway_factory: GatewayFactory,
    bedrock: FakeBedrock,
    fake_upstream: FakeUpstream,
    kind: str,
) -> None:
    # A chat client that sets reasoning_effort and sends its tool calls back as the OpenAI API
    # has them (no thinking_blocks, as most agents do): Claude refuses a tool-use turn that
    # does not begin with its thinking when thinking is on ("a final `assistant` message must
    # start with a thinking block"), so the hint turned every tool loop's second turn into a
    # 400. It is sent without thinking, as an effort Claude cannot think with is.
    claude = await _claude_of(kind, gateway_factory, bedrock, fake_upstream)
    call = {"id": "tu_1", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = '{"city": "Paris"}'  # type: ignore[index]
    loop: list[Any] = [
        *HI,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "tu_1", "content": "18C"},
    ]
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    client = claude.openai()

    answer = await client.chat.completions.create(
        model="m", messages=loop, tools=tools, reasoning_effort="high"
    )
    plain = await client.chat.completions.create(model="m", messages=HI, reasoning_effort="high")

    assert answer.choices[0].finish_reason in ("stop", "tool_calls")
    assert plain.choices[0].message is not None
    sent = _thinking_sent(kind, bedrock, fake_upstream)
    # Outside a tool loop the effort still makes Claude think.
    assert sent == [None, {"thinking": {"type": "enabled", "budget_tokens": 4096}}]


@pytest.mark.parametrize("kind", ["bedrock", "anthropic"])
async def test_a_messages_tool_loop_whose_turn_another_route_answered_is_answered(
    gateway_factory: GatewayFactory,
    bedrock: FakeBedrock,
    fake_upstream: FakeUpstream,
    kind: str,
) -> None:
    # Claude Code thinking (its own config) in a tool loop whose last turn another route of
    # the model answered (Gemini's, an OpenAI model's: no signed thinking, its reasoning an
    # unsigned block that is never sent to Claude): Claude refuses a tool-use turn that does
    # not begin with its thinking while it thinks, so the conversation died on a Claude route
    # with a 400 at every retry. The turn goes without thinking, as LiteLLM sends it.
    claude = await _claude_of(kind, gateway_factory, bedrock, fake_upstream)
    unsigned = {"type": "thinking", "thinking": "Gemini thought.", "signature": ""}
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": "18C"}
    loop: list[Any] = [
        *HI,
        {"role": "assistant", "content": [unsigned, TOOL_USE]},
        {"role": "user", "content": [result]},
    ]
    client = claude.anthropic()

    answer = await client.messages.create(
        model="m", max_tokens=2048, messages=loop, tools=TOOLS, thinking=CONFIG
    )
    plain = await client.messages.create(model="m", max_tokens=2048, messages=HI, thinking=CONFIG)

    assert answer.stop_reason in ("end_turn", "tool_use")
    assert plain.content
    sent = _thinking_sent(kind, bedrock, fake_upstream)
    # A new turn (no tool loop to continue) still thinks as asked.
    assert sent == [None, {"thinking": CONFIG}]
