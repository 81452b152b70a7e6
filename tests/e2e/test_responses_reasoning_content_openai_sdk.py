"""A reasoning model's ``reasoning_content`` (DeepSeek's, vLLM's) through a Responses tool
loop, as the official ``openai`` SDK runs it statelessly: turn one's ``reasoning`` item shows
it as ``reasoning_text`` content; sent back in turn two's ``input`` before the function call,
it reaches the ``openai_compat`` route as that assistant message's ``reasoning_content``, as
a chat client sends it. It was dropped, and DeepSeek's thinking mode refuses a tool turn
without it (400 "The reasoning_content in the thinking mode must be passed back").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    import openai

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

THOUGHT = "The user wants Paris's weather, so I call get_weather."
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
# What DeepSeek answers in thinking mode: its reasoning beside the call (a server that answers
# a stream request so is relayed as the equivalent stream).
DEEPSEEK = Reply(
    body={
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "deepseek-v4-flash",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": THOUGHT,
                    "tool_calls": [CALL],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": USAGE,
    }
)
TOOLS: Any = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
QUESTION: Any = [{"role": "user", "content": "weather in Paris?"}]


async def _first_turn(client: openai.AsyncOpenAI, stream: bool) -> list[Any]:
    if not stream:
        answer = await client.responses.create(model="m", input=QUESTION, tools=TOOLS)
        return [item.model_dump(exclude_none=True) for item in answer.output]
    async with client.responses.stream(model="m", input=QUESTION, tools=TOOLS) as events:
        done = [e.item async for e in events if e.type == "response.output_item.done"]
    return [item.model_dump(exclude_none=True) for item in done]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_reasoning_content_sent_back_in_a_responses_tool_loop_reaches_the_route(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, stream: bool
) -> None:
    fake_upstream.enqueue(DEEPSEEK)
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()

    first = await _first_turn(client, stream)
    reasoning, call = first
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "18C"}
    await client.responses.create(model="m", input=[*QUESTION, *first, output], tools=TOOLS)

    assistant = fake_upstream.requests[-1].json["messages"][1]
    assert assistant["reasoning_content"] == THOUGHT
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1"]
