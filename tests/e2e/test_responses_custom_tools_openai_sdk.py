"""Custom (freeform) tools on the Responses surface, through the official ``openai`` SDK: Codex
CLI's ``apply_patch`` with gpt-5 (``{"type": "custom", "format": {"type": "grammar", ...}}``).

They were refused with a 400 (``tools[0].type``), so Codex through the gateway failed. A route
speaking chat completions gets chat's own custom tools (gpt-5 takes them), and its custom tool
call comes back as a ``custom_tool_call`` item, plain and streamed; the call and its output,
sent back, reach the upstream as chat's call and tool message. A route that cannot take them
(Claude) refuses them with a 400 naming the tool. A chat client's custom tools pass through.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /.+/'}
APPLY_PATCH: Any = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the apply_patch tool to edit files.",
    "format": GRAMMAR,
}
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch\n"
CALL = {"id": "call_p1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}


def _answer() -> Reply:
    choice = {
        "index": 0,
        "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
    }
    usage = {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}
    body = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-5"}
    return Reply(body={**body, "choices": [choice], "usage": usage})


def _streamed() -> Reply:
    """The custom call's input in three fragments, the first with its id, type and name."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-5"}
        return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n"

    def fragment(text: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": 0, "custom": {"input": text}}]}

    opened = {"index": 0, "id": "call_p1", "type": "custom", "custom": {"name": "apply_patch"}}
    frames = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [opened]}),
        chunk(fragment(PATCH[:15])),
        chunk(fragment(PATCH[15:40])),
        chunk(fragment(PATCH[40:])),
        chunk({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    return Reply(body="".join(frames), headers={"content-type": "text/event-stream"})


def _route(kind: str, up: FakeUpstream) -> dict[str, Any]:
    """A route of ``kind`` to the fake upstream ``up``."""
    if kind == "openai_compat":
        return route(up)
    if kind == "anthropic":
        return anthropic_route(up)
    base = up.azure_base_url if kind == "azure_openai" else up.gemini_base_url
    azure = {"azure": {"deployment": "d", "api_version": "2024-10-21"}}
    return {
        "kind": kind,
        "base_url": base,
        "provider_model_id": "up-model",
        "api_key": "k",
        **(azure if kind == "azure_openai" else {}),
    }


def _sent_tools(upstream: FakeUpstream) -> Any:
    return upstream.requests[-1].json["tools"]


CHAT_TOOL = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "description": "Use the apply_patch tool to edit files.",
        "format": GRAMMAR,
    },
}


@pytest.mark.parametrize("kind", ["openai_compat", "azure_openai"])
async def test_responses_custom_tool_call_comes_back_from_a_chat_completions_route(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, kind: str
) -> None:
    fake_upstream.enqueue(_answer())
    client = (await gateway_factory(config(model("m", _route(kind, fake_upstream))))).openai()

    answer = await client.responses.create(
        model="m",
        input="add hello.txt",
        tools=[APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"},
    )

    assert _sent_tools(fake_upstream) == [CHAT_TOOL]
    sent = fake_upstream.requests[-1].json
    assert sent["tool_choice"] == {"type": "custom", "custom": {"name": "apply_patch"}}
    (item,) = answer.output
    assert item.type == "custom_tool_call"
    assert (item.call_id, item.name, item.input) == ("call_p1", "apply_patch", PATCH)
    assert answer.status == "completed"


async def test_responses_custom_tool_call_streams_its_input_from_an_openai_compat_route(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_streamed())
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()

    events = [
        event
        async for event in await client.responses.create(
            model="m", input="add hello.txt", tools=[APPLY_PATCH], stream=True
        )
    ]

    assert _sent_tools(fake_upstream) == [CHAT_TOOL]
    kinds = [e.type for e in events]
    assert kinds[kinds.index("response.output_item.added") :] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == PATCH
    done = events[-2]
    assert done.type == "response.output_item.done"
    assert done.item.type == "custom_tool_call" and done.item.input == PATCH
    final = events[-1]
    assert final.type == "response.completed"
    (item,) = final.response.output
    assert item.type == "custom_tool_call"
    assert (item.call_id, item.name, item.input) == ("call_p1", "apply_patch", PATCH)


async def test_responses_custom_tool_call_and_output_sent_back_reach_the_route_as_chats(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_answer())
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    first = await client.responses.create(model="m", input="add hello.txt", tools=[APPLY_PATCH])
    call = first.output[0]
    assert call.type == "custom_tool_call"

    answer = await client.responses.create(
        model="m",
        tools=[APPLY_PATCH],
        input=[
            {"role": "user", "content": "add hello.txt"},
            call.model_dump(exclude_none=True),  # as Codex sends it back
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"},
        ],
    )

    sent = fake_upstream.requests[-1].json
    assert sent["messages"] == [
        {"role": "user", "content": "add hello.txt"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_p1", "content": "Done!"},
    ]
    assert answer.status == "completed"


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
async def test_responses_custom_tool_to_a_route_without_them_is_a_400_naming_the_tool(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, kind: str
) -> None:
    client = (await gateway_factory(config(model("m", _route(kind, fake_upstream))))).openai()

    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="m", input="add hello.txt", tools=[APPLY_PATCH])

    error = info.value.body
    assert isinstance(error, dict)
    # The route refuses it (the surface no longer does): neither has freeform tools.
    assert error["param"] == ("tools[0].type" if kind == "anthropic" else "tools"), error
    assert f"tools[0]{'.type' if kind == 'anthropic' else ''}: " in error["message"]
    assert f"only function tools are supported by {kind} upstreams" in error["message"]
    assert not fake_upstream.requests


async def test_chat_custom_tools_and_their_call_pass_through_an_openai_compat_route(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_answer())
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()

    answer = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "add hello.txt"}], tools=[CHAT_TOOL]
    )

    assert _sent_tools(fake_upstream) == [CHAT_TOOL]
    calls = answer.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "custom"
    assert (call.id, call.custom.name, call.custom.input) == ("call_p1", "apply_patch", PATCH)


async def test_responses_custom_tool_refused_by_a_claude_route_is_served_by_the_chat_route(
    gateway_factory: GatewayFactory, fake_upstreams: Any
) -> None:
    claude, compat = await fake_upstreams("claude"), await fake_upstreams("compat")
    compat.enqueue(_answer())
    routes = (anthropic_route(claude, weight=1.0), route(compat, weight=1e-6))
    client = (await gateway_factory(config(model("m", *routes)))).openai()

    answer = await client.responses.create(model="m", input="add hello.txt", tools=[APPLY_PATCH])

    assert answer.output[0].type == "custom_tool_call"
    assert not claude.requests and _sent_tools(compat) == [CHAT_TOOL]
