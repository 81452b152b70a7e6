"""Parallel tool calls streamed by an ``openai_compat`` upstream that interleaves their
argument fragments (Cerebras, some vLLM tool parsers), or that numbers them all 0 (Ollama)
or not at all (Gemini's OpenAI endpoint), translated for a Messages client (the official
``anthropic`` SDK) and a Responses client, and relayed to a chat client (the ``openai`` SDK).

Each call must arrive whole before its block or item is closed: a Messages block takes no
``input_json_delta`` after its ``content_block_stop``, and a Responses ``function_call``
item's ``function_call_arguments.done`` and ``output_item.done`` carry its final arguments.
Clients act on those events (a tool runs at its block's stop), so a call closed before its
last fragment ran with empty arguments. Calls numbered alike were read as one: their ids,
names and arguments ran together, and a translated surface lost every call but the first.
Against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

WEATHER = {"city": "Paris"}
TIME = {"tz": "CET"}
SCHEMA = {"type": "object"}


def _interleaved() -> Reply:
    """Two calls opened one after the other, then their fragments alternating."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
        return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n"

    def call(index: int, **function: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, "function": function}]}

    opened = [
        {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": n}}
        for i, n in enumerate(("get_weather", "get_time"))
    ]
    frames = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": opened[:1]}),
        chunk({"tool_calls": opened[1:]}),
        chunk(call(0, arguments='{"city":')),
        chunk(call(1, arguments='{"tz":"CET"}')),
        chunk(call(0, arguments='"Paris"}')),
        chunk({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    return Reply(body="".join(frames), headers={"content-type": "text/event-stream"})


async def test_messages_stream_closes_each_interleaved_call_after_its_last_fragment(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_interleaved())
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    tools: Any = [
        {"name": "get_weather", "input_schema": SCHEMA},
        {"name": "get_time", "input_schema": SCHEMA},
    ]

    stopped: dict[int, Any] = {}
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=HI, tools=tools
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                assert event.index not in stopped, f"a delta after block {event.index} stopped"
            elif event.type == "content_block_stop":
                stopped[event.index] = event.content_block  # the SDK's block as it stands
        final = await stream.get_final_message()

    assert [(b.name, b.input) for b in stopped.values()] == [
        ("get_weather", WEATHER),
        ("get_time", TIME),
    ]
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in stopped.values()]
    assert final.stop_reason == "tool_use"


async def test_responses_stream_finishes_each_interleaved_call_with_its_whole_arguments(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_interleaved())
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    tools: Any = [
        {"type": "function", "name": "get_weather", "parameters": SCHEMA},
        {"type": "function", "name": "get_time", "parameters": SCHEMA},
    ]

    stream = await gw.openai().responses.create(model="m", input="hi", tools=tools, stream=True)
    done: dict[int, str] = {}
    items: dict[int, Any] = {}
    async for event in stream:
        if event.type == "response.function_call_arguments.delta":
            assert event.output_index not in done, "a delta after its call was done"
        elif event.type == "response.function_call_arguments.done":
            done[event.output_index] = event.arguments
        elif event.type == "response.output_item.done":
            items[event.output_index] = event.item
        elif event.type == "response.completed":
            output = event.response.output

    assert [json.loads(args) for args in done.values()] == [WEATHER, TIME]
    assert [(i.name, json.loads(i.arguments)) for i in items.values()] == [
        ("get_weather", WEATHER),
        ("get_time", TIME),
    ]
    assert [o.model_dump() for o in output] == [i.model_dump() for i in items.values()]


def _numbered_alike(index: int | None) -> Reply:
    """Two whole calls in two chunks, both at ``index`` (None: without one)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
        return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n"

    def call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        entry = {"id": call_id, "type": "function", "function": function}
        return {"tool_calls": [entry if index is None else {"index": index, **entry}]}

    frames = [
        chunk({"role": "assistant", "content": None}),
        chunk(call("call_a", "get_weather", WEATHER)),
        chunk(call("call_b", "get_time", TIME)),
        chunk({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    return Reply(body="".join(frames), headers={"content-type": "text/event-stream"})


CALLS = [("call_a", "get_weather", WEATHER), ("call_b", "get_time", TIME)]


@pytest.mark.parametrize("index", [0, None], ids=["all-at-0", "unnumbered"])
async def test_calls_numbered_alike_stay_apart_on_every_surface(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, index: int | None
) -> None:
    fake_upstream.enqueue(_numbered_alike(index), _numbered_alike(index), _numbered_alike(index))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    chat_tools: Any = [
        {"type": "function", "function": {"name": n, "parameters": SCHEMA}}
        for n in ("get_weather", "get_time")
    ]
    tools: Any = [{"name": n, "input_schema": SCHEMA} for n in ("get_weather", "get_time")]
    response_tools: Any = [
        {"type": "function", "name": n, "parameters": SCHEMA} for n in ("get_weather", "get_time")
    ]

    async with gw.openai().chat.completions.stream(
        model="m", messages=HI, tools=chat_tools
    ) as chat_stream:
        chat = await chat_stream.get_final_completion()
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=HI, tools=tools
    ) as messages_stream:
        message = await messages_stream.get_final_message()
    response = None
    async for event in await gw.openai().responses.create(
        model="m", input="hi", tools=response_tools, stream=True
    ):
        if event.type == "response.completed":
            response = event.response

    calls = chat.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert [(b.id, b.name, b.input) for b in message.content] == CALLS
    assert response is not None
    assert [(o.call_id, o.name, json.loads(o.arguments)) for o in response.output] == CALLS
