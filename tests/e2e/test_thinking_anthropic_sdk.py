"""Claude's extended thinking through the gateway to an ``anthropic`` route, and back.

A Messages client (the official ``anthropic`` SDK, as Claude Code calls it) asking for
``thinking`` gets Claude's thinking and redacted_thinking blocks with their real signatures,
plain and streamed (``signature_delta``), the stream accumulating to the plain answer; sent
back in a tool-use conversation they reach Claude unchanged, first in their turn, and the
config reaches it as it was sent. A chat client (the ``openai`` SDK) gets them as
``reasoning_content`` and ``thinking_blocks`` (LiteLLM's fields) and can send them back too;
a Responses client gets a reasoning item. Neither the config nor the blocks reach an
``openai_compat`` upstream, and another provider's reasoning (an unsigned thinking block) is
never sent to Claude. Against the scriptable fake upstream, on both buses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import HI, anthropic_route, config, model, route
from tests.fixtures.upstream import Reply, Thinking, ToolCall

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

THOUGHT = "The user wants the weather in Paris, so I call get_weather."
SIGNED = {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8"}
CLAUDE = Thinking((SIGNED, REDACTED), tool=ToolCall("get_weather", '{"city":"Paris"}', "toolu_1"))
CONFIG = {"type": "enabled", "budget_tokens": 1024}
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


async def _claude(gateway_factory: GatewayFactory, up: FakeUpstream) -> RunningGateway:
    """A gateway whose model ``m`` is the anthropic route ``up``, thinking twice."""
    up.enqueue(CLAUDE, CLAUDE)
    return await gateway_factory(config(model("m", anthropic_route(up))))


async def test_a_messages_client_gets_claudes_signed_thinking_plain_and_streamed(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped before: the upstream was never asked to think, and the answer held the
    # tool_use block only.
    client = (await _claude(gateway_factory, fake_upstream)).anthropic()
    ask: dict[str, Any] = {"model": "m", "max_tokens": 2048, "messages": HI, "tools": TOOLS}

    plain = await client.messages.create(**ask, thinking=CONFIG)
    async with client.messages.stream(**ask, thinking=CONFIG) as stream:
        events = [e async for e in stream]
        streamed = await stream.get_final_message()

    assert [r.json["thinking"] for r in fake_upstream.requests] == [CONFIG, CONFIG]
    content = [b.model_dump(exclude_none=True) for b in plain.content]
    assert content == [SIGNED, REDACTED, TOOL_USE]
    assert [b.model_dump(exclude_none=True) for b in streamed.content] == content
    assert [e.signature for e in events if e.type == "signature"] == [SIGNED["signature"]]
    assert "".join(e.thinking for e in events if e.type == "thinking") == THOUGHT
    assert (streamed.stop_reason, plain.stop_reason) == ("tool_use", "tool_use")
    assert streamed.usage.output_tokens == plain.usage.output_tokens


async def test_a_messages_client_sending_claudes_thinking_back_reaches_claude_unchanged(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped before: Anthropic refuses a tool_use turn without its thinking when it is on.
    client = (await _claude(gateway_factory, fake_upstream)).anthropic()
    ask: dict[str, Any] = {"model": "m", "max_tokens": 2048, "tools": TOOLS, "thinking": CONFIG}
    first = await client.messages.create(**ask, messages=HI)

    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}
    turn = [
        *HI,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    again = await client.messages.create(**ask, messages=turn)

    assert again.content[0].type == "thinking"
    sent = fake_upstream.requests[-1].json
    assert sent["thinking"] == CONFIG
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            SIGNED,
            REDACTED,
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    }


async def test_another_providers_reasoning_sent_back_never_reaches_claude(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    other, claude = await fake_upstreams("other"), await fake_upstreams("claude")
    message = {"role": "assistant", "content": "Hi!", "reasoning_content": "A greeting."}
    answer = {"id": "c1", "object": "chat.completion", "created": 1, "model": "x"}
    answer["choices"] = [{"index": 0, "message": message, "finish_reason": "stop"}]
    other.enqueue(Reply(body=answer))
    models = model("other", route(other)), model("claude", anthropic_route(claude))
    client = (await gateway_factory(config(*models))).anthropic()
    first = await client.messages.create(model="other", max_tokens=64, messages=HI)
    assert first.content[0].model_dump() == {
        "type": "thinking",
        "thinking": "A greeting.",
        "signature": "",
    }

    turn = [*HI, {"role": "assistant", "content": first.content}, {"role": "user", "content": "?"}]
    await client.messages.create(model="claude", max_tokens=64, messages=turn, thinking=CONFIG)

    # History's thinking blocks now reach an anthropic route: without the adapter dropping an
    # unsigned one, Claude would be sent it, and refuse it.
    assistant = claude.requests[-1].json["messages"][1]
    assert assistant == {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]}


async def test_an_openai_compat_upstream_gets_neither_the_config_nor_the_blocks(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # The Messages surface now carries both: without openai_compat dropping them, they leak
    # to the upstream (OpenAI refuses an argument it does not know).
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).anthropic()
    history = [
        *HI,
        {"role": "assistant", "content": [SIGNED, REDACTED, {"type": "text", "text": "Hi!"}]},
        {"role": "user", "content": "?"},
    ]

    await client.messages.create(model="m", max_tokens=2048, messages=history, thinking=CONFIG)

    sent = fake_upstream.requests[-1].json
    assert "thinking" not in sent
    assert sent["messages"][1] == {"role": "assistant", "content": "Hi!"}


async def test_a_chat_clients_own_thinking_still_reaches_an_openai_compat_upstream(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # A chat client's ``thinking`` is a provider extension (GLM's, DeepSeek's, Volcengine
    # Ark's ``{"type": "enabled" | "disabled"}``), passed through as every unknown field is;
    # dropping Claude's (the Messages surface's) for openai_compat had dropped it too.
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    off = {"type": "disabled"}

    await client.chat.completions.create(model="m", messages=HI, extra_body={"thinking": off})
    await client.chat.completions.create(
        model="m", messages=HI, stream=True, extra_body={"thinking": off}
    )

    assert [r.json.get("thinking") for r in fake_upstream.requests] == [off, off]
    assert not [r for r in fake_upstream.requests if "_claude_thinking" in r.json]


async def test_a_chat_client_gets_claudes_thinking_blocks_and_sends_them_back(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped before: no reasoning_content, no thinking_blocks, nothing to send back.
    fake_upstream.enqueue(CLAUDE)
    client = (await _claude(gateway_factory, fake_upstream)).openai()
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    ask: dict[str, Any] = {"model": "m", "tools": tools, "extra_body": {"thinking": CONFIG}}

    plain = await client.chat.completions.create(messages=HI, **ask)
    chunks = [
        c async for c in await client.chat.completions.create(messages=HI, stream=True, **ask)
    ]

    message = plain.choices[0].message
    extra = message.model_extra or {}
    assert (extra["reasoning_content"], extra["thinking_blocks"]) == (THOUGHT, [SIGNED, REDACTED])
    deltas = [c.choices[0].delta.model_extra or {} for c in chunks if c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == THOUGHT
    streamed = [b for d in deltas for b in d.get("thinking_blocks") or ()]
    assert streamed == [{**SIGNED, "index": 0}, {**REDACTED, "index": 1}]  # as list entries

    assert message.tool_calls is not None
    turn: Any = [
        *HI,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.model_dump() for c in message.tool_calls],
            "thinking_blocks": extra["thinking_blocks"],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
    ]
    await client.chat.completions.create(messages=turn, **ask)
    assert fake_upstream.requests[-1].json["messages"][1]["content"][:2] == [SIGNED, REDACTED]


async def test_a_chat_client_sending_thinking_blocks_that_are_not_objects_is_refused(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()
    turn: Any = [*HI, {"role": "assistant", "content": "Hi", "thinking_blocks": ["sig"]}, *HI]

    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=turn)

    assert caught.value.param == "messages[1].thinking_blocks[0]"
    assert not fake_upstream.requests


async def test_a_responses_client_gets_claudes_thinking_as_a_reasoning_item(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped before: the output held the function call only.
    client = (await _claude(gateway_factory, fake_upstream)).openai()

    answer = await client.responses.create(model="m", input="weather in Paris?")

    reasoning = answer.output[0]
    assert reasoning.type == "reasoning"
    assert [(c.type, c.text) for c in reasoning.content or ()] == [("reasoning_text", THOUGHT)]
    assert answer.output[1].type == "function_call"


async def test_a_reasoning_effort_makes_claude_think_with_its_budget(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped before: reasoning_effort never reached an anthropic route in any form.
    client = (await _claude(gateway_factory, fake_upstream)).openai()

    await client.chat.completions.create(model="m", messages=HI, reasoning_effort="high")
    await client.responses.create(model="m", input="hi", reasoning={"effort": "low"})

    chat, responses = (r.json for r in fake_upstream.requests)
    assert (chat["thinking"], chat["max_tokens"]) == (
        {"type": "enabled", "budget_tokens": 4096},
        4096 + 4096,
    )
    assert responses["thinking"] == {"type": "enabled", "budget_tokens": 1024}


async def test_a_reasoning_effort_claude_cannot_think_with_is_answered_without_thinking(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Its max_tokens not above the effort's budget, or a temperature Claude refuses while it
    # thinks: a chat client that was answered before efforts were mapped is answered still.
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    for extra in ({"max_tokens": 2048}, {"temperature": 0.2}):
        answer = await client.chat.completions.create(
            model="m", messages=HI, reasoning_effort="medium", **extra
        )
        assert answer.choices[0].message.content

    assert [("thinking" in r.json) for r in fake_upstream.requests] == [False, False]


async def test_a_messages_client_thinking_at_a_low_temperature_is_refused_naming_it(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Before: sent on, for Anthropic to refuse ("temperature may only be set to 1 when
    # thinking is enabled") after a route was spent on it.
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).anthropic()

    with pytest.raises(anthropic.BadRequestError) as caught:  # this SDK has no temperature
        await client.messages.create(
            model="m",
            max_tokens=2048,
            messages=HI,
            thinking=CONFIG,
            extra_body={"temperature": 0.2},
        )

    assert "temperature" in caught.value.message
    assert not fake_upstream.requests
