"""An upstream's reasoning (``reasoning_content``) reaches the translating surfaces' clients.

The Anthropic Messages client gets a ``thinking`` block (its signature empty: no Anthropic
signature exists for another provider's reasoning) before the text, the Responses client a
``reasoning`` item (the text as ``reasoning_text`` content) before the message; streamed,
each SDK's own stream helper accumulates the same answer as the plain one. Either client
sending that block or item back in a later turn is answered: the Messages client's block not
passed on, the Responses client's item as that turn's ``reasoning_content``, as chat sends it.
Each surface's official SDK over loopback HTTP, against a scripted fake upstream.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

THOUGHT = ["The user ", "greets me; ", "I greet back."]
TEXT = ["Hel", "lo!"]
BASE: dict[str, Any] = {"id": "chatcmpl-1", "created": 1, "model": "x"}
USAGE = {
    "prompt_tokens": 3,
    "completion_tokens": 9,
    "total_tokens": 12,
    "completion_tokens_details": {"reasoning_tokens": 7},
}


def _whole() -> Reply:
    message = {"role": "assistant", "content": "".join(TEXT), "reasoning_content": "".join(THOUGHT)}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {**BASE, "object": "chat.completion", "choices": [choice], "usage": USAGE}
    return Reply(body=json.dumps(body), headers={"content-type": "application/json"})


def _sse() -> Reply:
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": t} for t in THOUGHT] + [{"content": t} for t in TEXT]
    choices: list[dict[str, Any]] = [
        {"index": 0, "delta": d, "finish_reason": None} for d in deltas
    ]
    choices.append({"index": 0, "delta": {}, "finish_reason": "stop"})
    chunks = [{**BASE, "object": "chat.completion.chunk", "choices": [c]} for c in choices]
    chunks.append({**BASE, "object": "chat.completion.chunk", "choices": [], "usage": USAGE})
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Reply(body=body, headers={"content-type": "text/event-stream"})


async def _gateway(
    gateway_factory: GatewayFactory, up: FakeUpstream, *then: Reply
) -> RunningGateway:
    """A gateway whose one route is ``up``, answering first with reasoning, then ``then``."""
    up.enqueue(_whole(), *then)
    return await gateway_factory(config(model("m", route(up))))


async def test_a_messages_client_gets_the_reasoning_as_a_thinking_block_plain_and_streamed(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped: the answer held the text block only, plain and streamed.
    client = (await _gateway(gateway_factory, fake_upstream, _sse())).anthropic()

    plain = await client.messages.create(model="m", max_tokens=64, messages=HI)
    async with client.messages.stream(model="m", max_tokens=64, messages=HI) as stream:
        thinking = [e.thinking for e in [e async for e in stream] if e.type == "thinking"]
        streamed = await stream.get_final_message()

    assert [b.type for b in plain.content] == ["thinking", "text"]
    block = plain.content[0]
    assert (block.thinking, block.signature) == ("".join(THOUGHT), "")
    assert plain.content[1].text == "".join(TEXT) and plain.stop_reason == "end_turn"
    assert thinking == THOUGHT  # the SDK's own thinking events, one per upstream delta
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in plain.content]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == ("end_turn", 9)


async def test_a_messages_client_sending_its_thinking_block_back_is_answered(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    client = (await _gateway(gateway_factory, fake_upstream)).anthropic()
    plain = await client.messages.create(model="m", max_tokens=64, messages=HI)
    assert plain.content[0].type == "thinking"

    turn = [*HI, {"role": "assistant", "content": plain.content}, {"role": "user", "content": "?"}]
    again = await client.messages.create(model="m", max_tokens=64, messages=turn)

    assert again.content  # answered (the fake's default answer)
    sent = fake_upstream.requests[-1].json["messages"]
    assert sent[1] == {"role": "assistant", "content": "".join(TEXT)}  # the thinking dropped


async def test_a_responses_client_gets_the_reasoning_as_a_reasoning_item_plain_and_streamed(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Dropped: the output held the message item only, plain and streamed.
    client = (await _gateway(gateway_factory, fake_upstream, _sse())).openai()

    plain = await client.responses.create(model="m", input="hi")
    async with client.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.reasoning_text.delta"]
        streamed = await stream.get_final_response()

    assert [item.type for item in plain.output] == ["reasoning", "message"]
    reasoning = plain.output[0]
    assert reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", "".join(THOUGHT))]
    assert plain.output_text == "".join(TEXT) and plain.status == "completed"
    assert plain.usage.output_tokens_details.reasoning_tokens == 7
    assert deltas == THOUGHT
    assert _without_ids(streamed.output) == _without_ids(plain.output)
    assert streamed.usage == plain.usage


async def test_a_responses_client_sending_its_reasoning_item_back_is_answered(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    client = (await _gateway(gateway_factory, fake_upstream)).openai()
    plain = await client.responses.create(model="m", input="hi")
    assert plain.output[0].type == "reasoning"

    items = [item.model_dump(exclude_none=True) for item in plain.output]
    turn = [{"role": "user", "content": "hi"}, *items, {"role": "user", "content": "?"}]
    again = await client.responses.create(model="m", input=turn)

    assert again.output_text  # answered (the fake's default answer)
    sent = fake_upstream.requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    thought = "".join(THOUGHT)
    assert sent[1] == {"role": "assistant", "content": "".join(TEXT), "reasoning_content": thought}


def _without_ids(items: list[Any]) -> list[Any]:
    """Output items without their minted ids, nor the fields the stream helper's parsed
    types add unset (``parsed``)."""
    return [item.model_dump(exclude={"id"}, exclude_none=True) for item in items]
