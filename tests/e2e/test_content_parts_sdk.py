"""An OpenAI-compatible upstream's ``content`` given as a list of parts, on every surface.

Mistral's Magistral models stream ``delta.content`` as ``[{"type": "thinking", "thinking":
[{"type": "text", ...}]}]`` and ``[{"type": "text", "text": ...}]``; the OpenAI API allows
``text`` and ``refusal`` parts in an assistant message. The chat surface relays the parts as
the upstream sent them (its client speaks that provider's dialect); the Responses and
Messages surfaces show the text parts as text, the refusal parts as the refusal, the
thinking parts as reasoning (rendered as such: test_reasoning_surfaces_sdk.py), and other
parts not at all. A list
holding anything but objects is the upstream's bad response on every surface. Each surface's
official SDK, against a scripted fake upstream.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

SURFACES = ("chat", "responses", "messages")
BASE: dict[str, Any] = {"id": "chatcmpl-1", "created": 1, "model": "x"}
THOUGHT = "The user greets me."
THINKING = {"type": "thinking", "thinking": [{"type": "text", "text": THOUGHT}]}
REFUSAL = "I can't help with that."
# What the upstream says, each list a chunk's delta.content (joined: the whole answer's).
Parts = list[list[Any]]
MISTRAL: Parts = [[THINKING], [{"type": "text", "text": "Hel"}], [{"type": "text", "text": "lo"}]]
REFUSING: Parts = [
    [{"type": "refusal", "refusal": REFUSAL[:6]}],
    [{"type": "refusal", "refusal": REFUSAL[6:]}],
]
UNKNOWN: Parts = [[{"type": "reference", "reference_ids": [1]}, {"type": "text", "text": "Hello"}]]
JUNK: Parts = [["Hel", {"type": "text", "text": "lo"}]]


def _sse(parts: Parts) -> Reply:
    deltas: list[dict[str, Any]] = [{"content": p} for p in parts]
    deltas[0]["role"] = "assistant"
    chunks: list[dict[str, Any]] = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
    chunks.append({"index": 0, "delta": {}, "finish_reason": "stop"})
    events = [
        json.dumps({**BASE, "object": "chat.completion.chunk", "choices": [c]}) for c in chunks
    ]
    body = "".join(f"data: {e}\n\n" for e in [*events, "[DONE]"])
    return Reply(body=body, headers={"content-type": "text/event-stream"})


def _whole(parts: Parts) -> Reply:
    message = {"role": "assistant", "content": [p for chunk in parts for p in chunk]}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = {**BASE, "object": "chat.completion", "choices": [choice], "usage": usage}
    return Reply(body=json.dumps(body), headers={"content-type": "application/json"})


async def _gateway(gateway_factory: GatewayFactory, *routes: dict[str, Any]) -> RunningGateway:
    return await gateway_factory(config(model("m", *routes)))


async def _streamed(gw: RunningGateway, surface: str) -> tuple[Any, str, str]:
    """(the chat deltas' contents, or the text a translated stream gave; its refusal; how it
    ended). Fails the test on a stream with no terminal event."""
    if surface == "chat":
        stream = await gw.openai().chat.completions.create(model="m", messages=HI, stream=True)
        contents, finish = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                contents.append(choice.delta.content)
                finish = choice.finish_reason or finish
        return contents, "", str(finish)
    if surface == "responses":
        events = await gw.openai().responses.create(model="m", input="hi", stream=True)
        text, refusal, kinds = [], [], []
        async for event in events:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            elif event.type == "response.refusal.delta":
                refusal.append(event.delta)
            elif event.type == "response.completed":
                assert event.response.output_text == "".join(text)
        return "".join(text), "".join(refusal), kinds[-1]
    client = gw.anthropic()
    async with client.messages.stream(model="m", max_tokens=16, messages=HI) as s:
        async for _ in s:
            pass
        final = await s.get_final_message()
    texts = [b.text for b in final.content if b.type == "text"]
    return "".join(texts), "", str(final.stop_reason)


async def _whole_answer(gw: RunningGateway, surface: str) -> tuple[Any, str, str]:
    """(the chat message's content, or a translated answer's text; its refusal; its end)."""
    if surface == "chat":
        c = await gw.openai().chat.completions.create(model="m", messages=HI)
        return c.choices[0].message.content, "", str(c.choices[0].finish_reason)
    if surface == "responses":
        r = await gw.openai().responses.create(model="m", input="hi")
        parts = [p for item in r.output if item.type == "message" for p in item.content]
        refusal = "".join(p.refusal for p in parts if p.type == "refusal")
        return r.output_text, refusal, r.status
    m = await gw.anthropic().messages.create(model="m", max_tokens=16, messages=HI)
    return "".join(b.text for b in m.content if b.type == "text"), "", str(m.stop_reason)


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_mistral_thinking_stream_gives_each_surface_its_text_and_a_clean_end(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str
) -> None:
    # The Responses stream ended with no terminal event (finish failed on the list); the
    # Messages stream sent the list itself as its text deltas.
    fake_upstream.set_default(_sse(MISTRAL))
    gw = await _gateway(gateway_factory, route(fake_upstream))

    got, refusal, end = await _streamed(gw, surface)

    if surface == "chat":  # the provider's own dialect, as it said it
        assert got == [*MISTRAL, None] and end == "stop"
    else:
        assert got == "Hello" and THOUGHT not in got and not refusal
        assert end == ("response.completed" if surface == "responses" else "end_turn")


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_whole_answer_of_parts_gives_each_surface_its_text(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str
) -> None:
    fake_upstream.set_default(_whole(MISTRAL))
    gw = await _gateway(gateway_factory, route(fake_upstream))

    got, _, end = await _whole_answer(gw, surface)

    if surface == "chat":
        assert got == [p for chunk in MISTRAL for p in chunk] and end == "stop"
    else:
        assert got == "Hello" and end in ("completed", "end_turn")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("surface", ["responses", "messages"])
async def test_refusal_parts_reach_a_translated_surface_as_its_refusal(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, stream: bool
) -> None:
    # They were sent as text deltas holding the list (stream) or dropped (whole answer).
    fake_upstream.set_default(_sse(REFUSING) if stream else _whole(REFUSING))
    gw = await _gateway(gateway_factory, route(fake_upstream))

    text, refusal, end = await (_streamed if stream else _whole_answer)(gw, surface)

    if surface == "responses":
        assert (text, refusal) == ("", REFUSAL)
        assert end == ("response.completed" if stream else "completed")
    else:  # Messages has no refusal block: the refusal is the text the client reads
        assert text == REFUSAL
        assert end == "refusal"  # streamed too (it said end_turn)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("surface", ["responses", "messages"])
async def test_a_part_of_an_unknown_type_is_not_shown_on_a_translated_surface(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, stream: bool
) -> None:
    fake_upstream.set_default(_sse(UNKNOWN) if stream else _whole(UNKNOWN))
    gw = await _gateway(gateway_factory, route(fake_upstream))

    text, _, _ = await (_streamed if stream else _whole_answer)(gw, surface)

    assert text == "Hello"


JUNK_CASES = pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])


@JUNK_CASES
@pytest.mark.parametrize("surface", SURFACES)
async def test_parts_that_are_not_objects_are_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, surface: str, stream: bool
) -> None:
    # Relayed to chat clients as the answer, and skipped (whole) or sent as the text delta
    # (stream) by the translated surfaces.
    fake_upstream.set_default(_sse(JUNK) if stream else _whole(JUNK))
    gw = await _gateway(gateway_factory, route(fake_upstream))
    refused = openai.APIStatusError if surface != "messages" else anthropic.APIStatusError

    with pytest.raises(refused) as caught:
        await (_streamed if stream else _whole_answer)(gw, surface)

    status: Any = getattr(caught.value, "status_code", None)
    assert status == 502 and "content part" in str(caught.value)


@JUNK_CASES
@pytest.mark.parametrize("surface", SURFACES)
async def test_parts_that_are_not_objects_fail_over_to_the_next_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str, stream: bool
) -> None:
    evil, good = await fake_upstreams("evil"), await fake_upstreams("good")
    evil.set_default(_sse(JUNK) if stream else _whole(JUNK))
    gw = await _gateway(gateway_factory, route(evil), route(good, 1e-6))

    got, _, _ = await (_streamed if stream else _whole_answer)(gw, surface)

    assert got  # the good route's ordinary answer
    assert len(evil.requests) == 1 and len(good.requests) == 1
