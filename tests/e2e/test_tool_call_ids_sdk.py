"""A conversation whose tool calls another provider named reaches a Claude route with ids
Claude takes.

Anthropic refuses a ``tool_use`` id outside ``^[a-zA-Z0-9_-]+$`` (Bedrock's ``toolUseId`` too,
capped at 64 characters), and Kimi names its calls ``functions.get_weather:0``: a chat
client whose history came from such a provider (a fallback, a model switch mid-session) got
Claude's 400 for the whole conversation. Each id now reaches Claude as one of its own, the
same for the call and its result, distinct for distinct calls. Through the official openai
SDK, against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

CLAUDE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
KIMI_IDS = ["functions.get_weather:0", "functions.get_weather:1"]


def _call(call_id: str, city: str) -> dict[str, Any]:
    arguments = f'{{"city": "{city}"}}'
    return {"id": call_id, "type": "function", "function": {"name": "w", "arguments": arguments}}


async def test_chat_history_with_another_providers_call_ids_reaches_claude_with_valid_ids(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream))))
    messages: Any = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call(KIMI_IDS[0], "Paris"), _call(KIMI_IDS[1], "Oslo")],
        },
        {"role": "tool", "tool_call_id": KIMI_IDS[0], "content": "sunny"},
        {"role": "tool", "tool_call_id": KIMI_IDS[1], "content": "rain"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    tools: Any = [{"type": "function", "function": {"name": "w", "parameters": {}}}]

    await gw.openai().chat.completions.create(model="m", messages=messages, tools=tools)

    _, assistant, turn = fake_upstream.requests[-1].json["messages"]  # results, then the text
    uses = [b["id"] for b in assistant["content"]]
    results = [b for b in turn["content"] if b["type"] == "tool_result"]
    answered = [b["tool_use_id"] for b in results]
    assert all(CLAUDE_ID.fullmatch(i) for i in uses), uses
    assert answered == uses
    assert len(set(uses)) == 2
    assert [b["content"] for b in results] == ["sunny", "rain"]
