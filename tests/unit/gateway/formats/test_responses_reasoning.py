"""Claude's signed thinking on the Responses surface: a ``reasoning`` item's
``encrypted_content`` (when ``include`` asks for it) carries the canonical ``thinking_blocks``,
whole and streamed, and a ``reasoning`` input item holding it gives them back to the
assistant message of its turn. Answers and frames are parsed with the official SDK's types,
the input items checked against its param types.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseInputItemParam, ResponseStreamEvent

from gateway.formats import openai_responses
from gateway.formats._responses_reasoning import seal, unseal
from gateway.formats.openai_responses import ChatToResponsesStream
from schemas import InvalidRequestError

JSON = dict[str, Any]
_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_INPUT_ITEM: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseInputItemParam)

ASK: JSON = {"model": "m", "include": ["reasoning.encrypted_content"], "store": False}
SIGNED = {"type": "thinking", "thinking": "I call f.", "signature": "EqQBsig"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKredacted"}
LATER = {"type": "thinking", "thinking": "Then g.", "signature": "EqQBlater", "after": 1}
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
LATER_CALL = {"id": "toolu_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}
USER = {"role": "user", "content": "hi"}


def _answer(message: JSON) -> JSON:
    message = {"role": "assistant", "content": None, **message}
    return {"id": "c1", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def _chunk(delta: JSON, finish: str | None = None) -> JSON:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _events(chunks: list[JSON], request: JSON) -> list[JSON]:
    stream = ChatToResponsesStream("m", request=request)
    frames = [f for c in chunks for f in stream.feed(c)] + stream.finish()
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in frames]
    for event in events:
        _EVENT.validate_python(event)
    return events


def _input(items: list[Any]) -> list[JSON]:
    for item in items:
        _INPUT_ITEM.validate_python(item)
    messages: list[JSON] = openai_responses.to_chat_request({**ASK, "input": items})["messages"]
    return messages


CLAUDE = _answer(
    {"reasoning_content": "I call f.", "thinking_blocks": [SIGNED, REDACTED], "tool_calls": [CALL]}
)


def test_a_responses_answer_asked_for_it_carries_claudes_blocks_in_encrypted_content() -> None:
    response = Response.model_validate(
        openai_responses.from_chat_response(CLAUDE, model="m", request=ASK)
    )

    reasoning = response.output[0]
    assert reasoning.type == "reasoning"
    assert [(c.type, c.text) for c in reasoning.content or ()] == [("reasoning_text", "I call f.")]
    assert reasoning.encrypted_content is not None
    assert reasoning.encrypted_content.startswith("llmgw.rs1.")
    assert unseal(reasoning.encrypted_content, "p") == [SIGNED, REDACTED]


def test_a_responses_answer_not_asked_for_it_has_no_encrypted_content() -> None:
    plain = openai_responses.from_chat_response(CLAUDE, model="m", request={"model": "m"})
    other = _answer({"content": "Hi", "reasoning_content": "A greeting."})  # not Claude's

    asked = openai_responses.from_chat_response(other, model="m", request=ASK)

    assert "encrypted_content" not in plain["output"][0]
    assert asked["output"][0]["encrypted_content"] is None
    assert Response.model_validate(plain).output[0].type == "reasoning"


def test_a_responses_answer_with_only_redacted_thinking_still_has_an_item_to_carry_it() -> None:
    redacted = _answer({"content": "Hi", "thinking_blocks": [REDACTED]})

    output = openai_responses.from_chat_response(redacted, model="m", request=ASK)["output"]

    assert (output[0]["type"], output[0]["content"]) == ("reasoning", [])
    assert unseal(output[0]["encrypted_content"], "p") == [REDACTED]


def test_a_responses_answer_sent_back_gives_claude_its_blocks_before_the_tool_call() -> None:
    interleaved = _answer({"thinking_blocks": [SIGNED, LATER], "tool_calls": [CALL, LATER_CALL]})
    response = Response.model_validate(
        openai_responses.from_chat_response(interleaved, model="m", request=ASK)
    )
    items = [item.model_dump(exclude_none=True) for item in response.output]
    result = {"type": "function_call_output", "call_id": "toolu_2", "output": "ok"}

    messages = _input([USER, *items, result])

    assert messages[1]["thinking_blocks"] == [SIGNED, LATER]  # ``after`` kept: order rebuilt
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["toolu_1", "toolu_2"]


def test_a_responses_stream_seals_each_reasoning_items_blocks_at_its_output_item_done() -> None:
    chunks = [
        _chunk({"role": "assistant", "reasoning_content": "I call f."}),
        _chunk({"thinking_blocks": [SIGNED]}),
        _chunk({"thinking_blocks": [REDACTED]}),
        _chunk({"tool_calls": [{"index": 0, **CALL}]}),
        _chunk({"reasoning_content": "Then g."}),
        _chunk({"thinking_blocks": [LATER]}),
        _chunk({"tool_calls": [{"index": 1, **LATER_CALL}]}),
        _chunk({}, "tool_calls"),
    ]

    events = _events(chunks, ASK)

    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item["type"] for item in done] == ["reasoning", "function_call"] * 2
    assert unseal(done[0]["encrypted_content"], "p") == [SIGNED, REDACTED]
    assert unseal(done[2]["encrypted_content"], "p") == [LATER]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert "encrypted_content" not in added[0]  # the blocks come whole, later
    assert events[-1]["response"]["output"] == done
    result = {"type": "function_call_output", "call_id": "toolu_2", "output": "ok"}
    assert _input([USER, *done, result])[1]["thinking_blocks"] == [SIGNED, REDACTED, LATER]
    unasked = _events(chunks, {"model": "m"})  # as OpenAI: only when ``include`` asks
    assert not [e for e in unasked if "encrypted_content" in e.get("item", ())]


def test_a_responses_stream_opens_a_reasoning_item_for_a_redacted_block_after_text() -> None:
    chunks = [
        _chunk({"content": "Hi"}),
        _chunk({"thinking_blocks": [REDACTED]}),
        _chunk({}, "stop"),
    ]

    done = [e["item"] for e in _events(chunks, ASK) if e["type"] == "response.output_item.done"]

    assert [item["type"] for item in done] == ["message", "reasoning"]
    assert unseal(done[1]["encrypted_content"], "p") == [REDACTED]


def _reasoning(encrypted: Any) -> JSON:
    return {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encrypted}


def _call(call_id: str) -> JSON:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def test_a_reasoning_input_item_joins_the_assistant_message_of_its_turn() -> None:
    text = {"role": "assistant", "content": "Let me look."}

    assert _input([USER, _reasoning(seal([SIGNED])), text, _call("c1")])[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"id": "c1", "type": "function", "function": CALL["function"]}],
        "thinking_blocks": [SIGNED],
    }
    # after the text: it joins the message the call joins, ``after`` telling where it stood
    joined = _input([USER, text, _reasoning(seal([LATER])), _call("c1")])
    assert joined[1]["thinking_blocks"] == [LATER]
    # its turn ends first: the assistant message before it, if any
    trailing = _input([USER, text, _reasoning(seal([LATER])), USER])
    assert trailing[1]["thinking_blocks"] == [LATER]
    assert [m.get("thinking_blocks") for m in _input([_reasoning(seal([SIGNED])), USER])] == [None]


@pytest.mark.parametrize(
    "encrypted",
    [None, "gAAAAABo-openai-fernet-token", "llmgw.rs9.eyJ9"],
    ids=["null", "openai", "v9"],
)
def test_a_reasoning_input_item_not_carrying_our_blocks_gives_nothing(encrypted: Any) -> None:
    # Claude refuses unsigned thinking and another provider's: never sent as if signed.
    items = [USER, _reasoning(encrypted), _reasoning(seal([SIGNED])), _call("c1")]

    assert _input(items)[1]["thinking_blocks"] == [SIGNED]


@pytest.mark.parametrize(
    "encrypted",
    [
        "llmgw.rs1.%%%",
        "llmgw.rs1." + "bm90IGpzb24",  # "not json"
        seal([SIGNED])[:-8],  # type: ignore[index]
        "llmgw.rs1.W10",  # []
        "llmgw.rs1.W3sidHlwZSI6InRoaW5raW5nIn1d",  # [{"type":"thinking"}]: no signature
        42,
    ],
    ids=["not-base64", "not-json", "cut", "empty", "unsigned", "number"],
)
def test_a_mangled_encrypted_content_is_refused_naming_it(encrypted: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        openai_responses.to_chat_request({**ASK, "input": [USER, _reasoning(encrypted)]})

    assert caught.value.param == "input[1].encrypted_content"
