"""Claude's signed thinking through a Responses tool loop, as the official ``openai`` SDK runs
it statelessly (``store=False``, ``include=["reasoning.encrypted_content"]``): turn one's
reasoning item carries Claude's blocks in ``encrypted_content``; turn two sends the output
items back with the function call's output, and Claude gets its thinking blocks, signatures
unchanged, first in the assistant turn, before its tool_use, thinking still on. Plain and
streamed, against the scriptable fake Anthropic upstream. Sent to an ``openai_compat``
route instead, the blocks never reach it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route
from tests.fixtures.upstream import Thinking, ToolCall

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

THOUGHT = "The user wants the weather in Paris, so I call get_weather."
SIGNED = {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8"}
CLAUDE = Thinking((SIGNED, REDACTED), tool=ToolCall("get_weather", '{"city":"Paris"}', "toolu_1"))
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOLS: Any = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
ASK: dict[str, Any] = {
    "model": "m",
    "tools": TOOLS,
    "reasoning": {"effort": "low"},
    "include": ["reasoning.encrypted_content"],
    "store": False,
}
QUESTION: Any = [{"role": "user", "content": "weather in Paris?"}]


async def _first_turn(client: openai.AsyncOpenAI, stream: bool) -> list[Any]:
    """Turn one's output items; streamed, as ``response.output_item.done`` gave them (what
    the SDK's docs tell a streaming client to send back)."""
    if not stream:
        return list((await client.responses.create(input=QUESTION, **ASK)).output)
    async with client.responses.stream(input=QUESTION, **ASK) as events:
        done = [e.item async for e in events if e.type == "response.output_item.done"]
        final = await events.get_final_response()
    assert done[0] == final.output[0]
    return done


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_responses_tool_loop_sends_claudes_signed_thinking_back_before_its_tool_use(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, stream: bool
) -> None:
    # Dropped before: turn two reached Claude without its thinking, and without thinking
    # (the gateway turns it off for a tool turn with no signed thinking, which Claude refuses).
    fake_upstream.enqueue(CLAUDE)
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    first = await _first_turn(client, stream)
    reasoning, call = first
    assert (reasoning.type, call.type) == ("reasoning", "function_call")
    assert reasoning.encrypted_content
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}
    turn: Any = [*QUESTION, *first, output]
    await client.responses.create(input=turn, **ASK)

    sent = fake_upstream.requests[-1].json
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert sent["messages"][1] == {"role": "assistant", "content": [SIGNED, REDACTED, TOOL_USE]}


async def test_encrypted_content_comes_only_when_asked_and_never_reaches_openai_compat(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    # As OpenAI, encrypted_content only when ``include`` asks for it; sent back to another
    # kind of route, Claude's blocks are dropped there as the chat surface's are.
    claude, other = await fake_upstreams("claude"), await fake_upstreams("other")
    claude.enqueue(CLAUDE, CLAUDE)
    models = model("m", anthropic_route(claude)), model("gpt", route(other))
    client = (await gateway_factory(config(*models))).openai()

    unasked = await client.responses.create(input=QUESTION, **{**ASK, "include": None})
    first = await client.responses.create(input=QUESTION, **ASK)
    call = first.output[1]
    assert call.type == "function_call"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}
    turn: Any = [*QUESTION, *first.output, output]
    await client.responses.create(input=turn, **{**ASK, "model": "gpt"})

    assert (unasked.output[0].type, unasked.output[0].encrypted_content) == ("reasoning", None)
    assert first.output[0].encrypted_content
    sent = other.requests[-1].json["messages"][1]
    assert (sent["tool_calls"][0]["id"], "thinking_blocks" in sent) == ("toolu_1", False)


async def test_a_responses_client_sending_a_mangled_encrypted_content_is_refused_naming_it(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "llmgw.rs1.%"}

    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(input=[*QUESTION, item], **ASK)

    assert caught.value.param == "input[1].encrypted_content"
    assert not fake_upstream.requests
