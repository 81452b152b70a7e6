"""A tool call without arguments that Claude streams (an ``anthropic`` route) reaches the
client with arguments ``{}``, as its whole answer and OpenAI give them: Claude streams no
input at all for it (a ``tool_use`` block whose ``input`` is ``{}`` and at most an empty
``input_json_delta``), which reached the client as arguments ``""``, not JSON, so a client
that parses them (Codex CLI, the OpenAI Agents SDK's integrations) failed the call. Through
the official ``openai`` SDK, on the Responses surface and the chat one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

TOOLS: Any = [{"type": "function", "name": "now", "parameters": {"type": "object"}}]
CHAT_TOOLS: Any = [
    {"type": "function", "function": {"name": "now", "parameters": TOOLS[0]["parameters"]}}
]


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


_USAGE = {"input_tokens": 5, "output_tokens": 1}
# What the Messages API streams for a call of a tool that takes no arguments.
CLAUDE_CALLS_NOW = Reply(
    body="".join(
        (
            _event(
                "message_start",
                {
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": "c",
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": _USAGE,
                    }
                },
            ),
            _event(
                "content_block_start",
                {
                    "index": 0,
                    "content_block": {
                        "type": "tool_use",
                        "id": "toolu_9",
                        "name": "now",
                        "input": {},
                    },
                },
            ),
            _event(
                "content_block_delta",
                {"index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
            ),
            _event("content_block_stop", {"index": 0}),
            _event("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": _USAGE}),
            _event("message_stop", {}),
        )
    ),
    headers={"content-type": "text/event-stream"},
)


async def test_a_responses_stream_gives_claudes_call_without_arguments_an_empty_object(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(CLAUDE_CALLS_NOW)
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    async with client.responses.stream(model="m", input="time?", tools=TOOLS) as events:
        done = [
            e.arguments async for e in events if e.type == "response.function_call_arguments.done"
        ]
        final = await events.get_final_response()

    (call,) = final.output
    assert call.type == "function_call"
    assert (done, call.arguments, call.call_id) == (["{}"], "{}", "toolu_9")


async def test_a_chat_stream_gives_claudes_call_without_arguments_an_empty_object(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(CLAUDE_CALLS_NOW)
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "time?"}], tools=CHAT_TOOLS, stream=True
    )
    deltas = [c.choices[0].delta async for c in stream if c.choices]

    pieces = [
        call.function.arguments or ""
        for d in deltas
        for call in d.tool_calls or ()
        if call.function is not None
    ]
    assert "".join(pieces) == "{}"
