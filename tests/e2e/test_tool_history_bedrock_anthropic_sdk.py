"""A conversation holding tool calls, asked without tools, is answered on a ``bedrock`` route.

Converse refuses ``toolUse`` and ``toolResult`` blocks in a request with no ``toolConfig``
(``ValidationException``: "The toolConfig field must be defined when using toolUse and
toolResult content blocks"); a client that asks about such a conversation with no tools (a
summary, Claude Code compacting its history) or with ``tool_choice: none`` (which Converse
has no member for, so the tools are left out) got that 400 from every Bedrock route. Now the
request carries a tool no answer is meant to call, as LiteLLM sends one. Through the
official ``anthropic`` SDK against the fake Bedrock (which refuses such a request as Bedrock
does), on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route
from tests.fixtures.upstream_bedrock import FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
USE = {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "tu_1", "content": "18C"}
HISTORY: list[Any] = [
    *HI,
    {"role": "assistant", "content": [USE]},
    {"role": "user", "content": [RESULT, {"type": "text", "text": "Summarise this."}]},
]


@pytest.mark.parametrize("tools", ["none_given", "tool_choice_none"])
async def test_a_tool_history_asked_without_tools_is_answered(
    gateway_factory: GatewayFactory, tools: str
) -> None:
    bedrock = FakeBedrock("bedrock1")
    async with bedrock:
        gw = await gateway_factory(config(model("m", bedrock_route(bedrock))))
        ask: dict[str, Any] = {"model": "m", "max_tokens": 9, "messages": HISTORY}
        if tools == "tool_choice_none":
            ask.update(tools=TOOLS, tool_choice={"type": "none"})

        answer = await gw.anthropic().messages.create(**ask)

        sent = bedrock.requests[-1].json
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"
    offered = [tool["toolSpec"]["name"] for tool in sent["toolConfig"]["tools"]]
    assert "get_weather" not in offered  # none may be called
