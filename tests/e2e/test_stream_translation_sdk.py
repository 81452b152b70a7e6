"""A stream translated into another API's shape is one the official SDKs' stream helpers
accumulate into the answer the upstream gave (defects a fuzz of upstream streams found):

- a tool call's last arguments fragment sent in one delta with text (servers that merge
  deltas) reaches the call's Messages block and Responses item before they close;
- a refusal streamed to a Messages client ends with ``stop_reason: refusal``, as the whole
  answer does;
- Claude's several thinking blocks streamed to a chat client (from an ``anthropic`` or a
  ``bedrock`` route) are list entries with an ``index`` (the openai SDK's accumulator
  refused the second one);
- tool calls an upstream numbers from 1 reach a chat client numbered from 0, and a call whose
  id comes after its first fragment stays one call;
- a Gemini stream whose finishing event carries no ``usageMetadata`` reports the running
  totals an earlier event gave, not zeros.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.bad_answers_support import SSE
from tests.e2e.conftest import HI, ONE_BUS, anthropic_route, config, model, route
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route
from tests.fixtures.upstream import FakeUpstream, Reply, Thinking
from tests.fixtures.upstream_bedrock import FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

TOOLS: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _chat_event(delta: dict[str, Any], finish: str | None = None) -> str:
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "x",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def _chat_stream(*events: str) -> Reply:
    return Reply(body="".join([*events, "data: [DONE]\n\n"]), headers=SSE)


def _claude_stream(*frames: dict[str, Any]) -> Reply:
    body = "".join(f"event: {f['type']}\ndata: {json.dumps(f)}\n\n" for f in frames)
    return Reply(body=body, headers=SSE)


def _claude_block(index: int, block: dict[str, Any], *deltas: dict[str, Any]) -> list[Any]:
    """The events of Claude's content block ``index``: its start, ``deltas``, its stop."""
    at = {"index": index}
    return [
        {"type": "content_block_start", **at, "content_block": block},
        *({"type": "content_block_delta", **at, "delta": d} for d in deltas),
        {"type": "content_block_stop", **at},
    ]


def _merged_last_fragment() -> Reply:
    """A call opened with ``{"a":``; its last fragment ``1}`` comes in one delta with text."""
    opened = {"index": 0, "id": "call_1", "type": "function"}
    opened["function"] = {"name": "f", "arguments": '{"a":'}
    return _chat_stream(
        _chat_event({"role": "assistant", "tool_calls": [opened]}),
        _chat_event(
            {"content": "ok", "tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}
        ),
        _chat_event({}, "tool_calls"),
    )


async def test_a_calls_last_fragment_merged_with_text_reaches_its_messages_block_before_it_stops(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_merged_last_fragment())
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    stopped: set[int] = set()
    late: list[Any] = []
    async with gw.anthropic().messages.stream(model="m", max_tokens=100, messages=HI) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.index in stopped:
                late.append(event)
            elif event.type == "content_block_stop":
                stopped.add(event.index)
        final = await stream.get_final_message()

    assert late == []  # before: "1}" on block 0 after its content_block_stop
    blocks = [
        (b.type, getattr(b, "input", None) or getattr(b, "text", None)) for b in final.content
    ]
    assert blocks == [("tool_use", {"a": 1}), ("text", "ok")]


async def test_a_calls_last_fragment_merged_with_text_is_in_its_responses_items_done_events(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_merged_last_fragment())
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    done: list[str] = []
    async with gw.openai().responses.stream(model="m", input="hi") as stream:
        async for event in stream:
            if event.type == "response.function_call_arguments.done":
                done.append(event.arguments)
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                done.append(event.item.arguments)
        final = await stream.get_final_response()

    assert done == ['{"a":1}', '{"a":1}']  # before: '{"a":' in both
    assert [i.type for i in final.output] == ["function_call", "message"]


async def test_a_refusal_streamed_to_a_messages_client_stops_as_the_whole_answer_does(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help."}
    whole = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "x",
        "choices": [{"index": 0, "finish_reason": "stop", "message": refusal}],
    }
    streamed = _chat_stream(_chat_event(refusal), _chat_event({}, "stop"))
    fake_upstream.enqueue(Reply(body=whole), streamed)
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    client = gw.anthropic()

    plain = await client.messages.create(model="m", max_tokens=100, messages=HI)
    async with client.messages.stream(model="m", max_tokens=100, messages=HI) as stream:
        final = await stream.get_final_message()

    assert plain.stop_reason == final.stop_reason == "refusal"  # streamed: end_turn before
    assert [b.text for b in final.content if b.type == "text"] == ["I can't help."]


async def test_claudes_thinking_blocks_streamed_to_a_chat_client_accumulate_in_the_sdk(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    usage = {"input_tokens": 5, "output_tokens": 1}
    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "c", "content": []}
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    fake_upstream.enqueue(
        _claude_stream(
            {"type": "message_start", "message": {**start, "usage": usage}},
            *_claude_block(0, {"type": "redacted_thinking", "data": "EmwK"}),
            *_claude_block(
                1,
                thinking,
                {"type": "thinking_delta", "thinking": "hmm"},
                {"type": "signature_delta", "signature": "sig"},
            ),
            *_claude_block(2, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Hi"}),
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
            {"type": "message_stop"},
        )
    )
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream))))

    async with gw.openai().chat.completions.stream(model="m", messages=HI) as stream:
        final = await stream.get_final_completion()  # before: RuntimeError, no `index` key

    message = final.choices[0].message
    assert message.content == "Hi"
    blocks = (message.model_extra or {})["thinking_blocks"]
    assert [(b["type"], b.get("data"), b.get("signature")) for b in blocks] == [
        ("redacted_thinking", "EmwK", None),
        ("thinking", None, "sig"),
    ]
    # Sent back as the SDK accumulated it (each entry with its index), Claude gets its
    # blocks as it gave them.
    fake_upstream.enqueue(Reply())
    turn: Any = {"role": "assistant", "content": "Hi", "thinking_blocks": blocks}
    again: Any = [*HI, turn, {"role": "user", "content": "go on"}]
    await gw.openai().chat.completions.create(model="m", messages=again)
    sent = fake_upstream.requests[-1].json
    assert sent is not None and sent["messages"][1]["content"][:2] == [
        {"type": "redacted_thinking", "data": "EmwK"},
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
    ]


async def test_claudes_thinking_blocks_from_bedrock_streamed_to_a_chat_client_accumulate(
    gateway_factory: GatewayFactory,
) -> None:
    signed = {"type": "thinking", "thinking": "Paris, then.", "signature": "EqQBCgIYAhIM"}
    redacted = {"type": "redacted_thinking", "data": "cmVkYWN0ZWQ="}
    up = FakeBedrock("bedrock1", chunks=3)
    async with up:
        up.enqueue(Thinking((signed, redacted)))
        gw = await gateway_factory(config(model("m", bedrock_route(up))))  # Claude's model id
        thinking: Any = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
        async with gw.openai().chat.completions.stream(
            model="m", messages=HI, extra_body=thinking
        ) as stream:
            final = await stream.get_final_completion()  # before: RuntimeError, no `index`

    blocks = (final.choices[0].message.model_extra or {})["thinking_blocks"]
    assert blocks == [{**signed, "index": 0}, {**redacted, "index": 1}]


async def test_tool_calls_an_upstream_numbers_from_1_reach_a_chat_client_numbered_from_0(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    second = {"index": 2, "id": "call_2", "type": "function"}
    second["function"] = {"name": "f", "arguments": '{"b":2}'}
    first = {"index": 1, "id": "call_1", "type": "function"}
    first["function"] = {"name": "f", "arguments": '{"a":'}
    fake_upstream.enqueue(
        _chat_stream(
            _chat_event({"role": "assistant", "content": "ok"}),
            _chat_event({"tool_calls": [first]}),
            _chat_event({"tool_calls": [{"index": 1, "function": {"arguments": "1}"}}]}),
            _chat_event({"tool_calls": [second]}),
            _chat_event({}, "tool_calls"),
        )
    )
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    async with gw.openai().chat.completions.stream(model="m", messages=HI, tools=TOOLS) as stream:
        final = await stream.get_final_completion()  # before: IndexError in the accumulator

    calls = final.choices[0].message.tool_calls or []
    assert [(c.id, c.function.arguments) for c in calls] == [
        ("call_1", '{"a":1}'),
        ("call_2", '{"b":2}'),
    ]


async def test_a_tool_call_whose_id_comes_after_its_first_fragment_stays_one_call(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    def fragment(index: int, **call: Any) -> str:
        return _chat_event({"tool_calls": [{"index": index, **call}]})

    fake_upstream.enqueue(
        _chat_stream(
            _chat_event({"role": "assistant", "content": None}),
            fragment(0, type="function", function={"name": "f"}),
            fragment(0, id="call_1", function={"arguments": '{"a":'}),
            fragment(0, function={"arguments": "1}"}),
            fragment(1, type="function", function={"name": "f"}),
            fragment(1, id="call_2", function={"arguments": "{}"}),
            _chat_event({}, "tool_calls"),
        )
    )
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    async with gw.openai().chat.completions.stream(model="m", messages=HI, tools=TOOLS) as stream:
        final = await stream.get_final_completion()

    calls = final.choices[0].message.tool_calls or []
    # Numbered by its id alone, each call's id-less first fragment was a call of its own.
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_1", "f", '{"a":1}'),
        ("call_2", "f", "{}"),
    ]


async def test_a_gemini_stream_finishing_without_usage_reports_the_last_totals_it_gave(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    def event(parts: list[Any], finish: str | None = None, **extra: Any) -> str:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        return f"data: {json.dumps({'candidates': [candidate], 'responseId': 'r', **extra})}\n\n"

    totals = {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18}
    body = event([{"text": "Hello"}], usageMetadata=totals) + event([{"text": ""}], "STOP")
    fake_upstream.enqueue(Reply(body=body, headers=SSE))
    gemini = {"kind": "gemini", "base_url": fake_upstream.gemini_base_url, "api_key": "k"}
    gw = await gateway_factory(config(model("m", {**gemini, "provider_model_id": "g"})))

    stream = await gw.openai().chat.completions.create(
        model="m", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]

    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (11, 7)
