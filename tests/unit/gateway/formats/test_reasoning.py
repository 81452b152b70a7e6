"""Canonical reasoning (``reasoning_content``, OpenRouter's ``reasoning``, Mistral's thinking
parts) rendered by the translating surfaces: a Messages ``thinking`` block, a Responses
``reasoning`` item, whole and streamed. Each frame and answer is checked against the
official SDKs' types; the stream's indexes and sequence numbers against the plain answer.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from gateway.formats import anthropic_messages, openai_responses
from gateway.formats.anthropic_messages import ChatToMessagesStream
from gateway.formats.openai_responses import ChatToResponsesStream

JSON = dict[str, Any]
_RESPONSES_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_MESSAGES_EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)

THOUGHT = "The user greets me. "
MORE = "I greet back."


def _chunk(delta: JSON, finish: str | None = None) -> JSON:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _answer(message: JSON, finish: str = "stop") -> JSON:
    message = {"role": "assistant", **message}
    return {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
STREAM = [
    _chunk({"role": "assistant", "content": "", "reasoning_content": THOUGHT}),
    _chunk({"reasoning_content": MORE}),
    _chunk({"content": "Hel"}),
    _chunk({"content": "lo"}),
    _chunk({"tool_calls": [{"index": 0, **CALL}]}),
    _chunk({}, "tool_calls"),
]


def _frames(renderer: Any, chunks: list[JSON]) -> list[JSON]:
    frames = [f for c in chunks for f in renderer.feed(c)] + renderer.finish()
    return [json.loads(f.split(b"data: ", 1)[1]) for f in frames]


# ------------------------------------------------------------------------------ Messages


@pytest.mark.parametrize(
    "message",
    [
        {"content": "Hello", "reasoning_content": THOUGHT},
        {"content": "Hello", "reasoning": THOUGHT},  # OpenRouter's name
        {"content": "Hello", "reasoning_content": THOUGHT, "reasoning": THOUGHT},  # both: once
        {"content": [{"type": "thinking", "thinking": THOUGHT}, {"type": "text", "text": "Hello"}]},
    ],
    ids=["reasoning_content", "reasoning", "both", "mistral_parts"],
)
def test_a_messages_answer_with_reasoning_opens_with_an_unsigned_thinking_block(
    message: JSON,
) -> None:
    # The reasoning was dropped: content held the text block only.
    answer = anthropic_messages.from_chat_response(_answer(message), model="m")

    parsed = anthropic.types.Message.model_validate(answer)
    assert [b.type for b in parsed.content] == ["thinking", "text"]
    thinking = parsed.content[0]
    assert isinstance(thinking, anthropic.types.ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == (THOUGHT, "")


@pytest.mark.parametrize("message", [{"content": "Hello"}, {"content": "Hello", "reasoning": ""}])
def test_a_messages_answer_without_reasoning_has_no_thinking_block(message: JSON) -> None:
    answer = anthropic_messages.from_chat_response(_answer(message), model="m")
    assert [b["type"] for b in answer["content"]] == ["text"]


def test_a_messages_stream_with_reasoning_streams_a_thinking_block_at_index_0() -> None:
    # No thinking block: the text block was index 0 and the tool block index 1.
    events = _frames(ChatToMessagesStream("m"), STREAM)
    for event in events:
        if event["type"] != "ping":  # not one of the SDK's message events
            _MESSAGES_EVENT.validate_python(event)

    blocks = [
        (e["index"], e["content_block"]) for e in events if e["type"] == "content_block_start"
    ]
    assert blocks[0] == (0, {"type": "thinking", "thinking": "", "signature": ""})
    assert [(i, b["type"]) for i, b in blocks] == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    deltas = [(e["index"], e["delta"]) for e in events if e["type"] == "content_block_delta"]
    assert deltas[:3] == [
        (0, {"type": "thinking_delta", "thinking": THOUGHT}),
        (0, {"type": "thinking_delta", "thinking": MORE}),
        (1, {"type": "text_delta", "text": "Hel"}),
    ]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]  # each block closed, in order, before the next opens
    kinds = [e["type"] for e in events]
    assert kinds.index("content_block_stop") < kinds.index("content_block_start", 3)


def test_a_messages_stream_with_reasoning_after_text_opens_another_thinking_block() -> None:
    chunks = [_chunk({"content": "Hi"}), _chunk({"reasoning": "Hmm"}), _chunk({"content": "!"})]
    events = _frames(ChatToMessagesStream("m"), [*chunks, _chunk({}, "stop")])
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["text", "thinking", "text"]


# ----------------------------------------------------------------------------- Responses


@pytest.mark.parametrize(
    "message",
    [
        {"content": "Hello", "reasoning_content": THOUGHT},
        {"content": "Hello", "reasoning": THOUGHT},
        {"content": [{"type": "thinking", "thinking": THOUGHT}, {"type": "text", "text": "Hello"}]},
    ],
    ids=["reasoning_content", "reasoning", "mistral_parts"],
)
def test_a_responses_answer_with_reasoning_opens_with_a_reasoning_item(message: JSON) -> None:
    # The reasoning was dropped: the output held the message item only.
    response = Response.model_validate(
        openai_responses.from_chat_response(_answer(message), model="m")
    )

    assert [item.type for item in response.output] == ["reasoning", "message"]
    item = response.output[0]
    assert item.type == "reasoning" and item.id.startswith("rs_")
    assert item.summary == [] and item.status == "completed"
    assert [(c.type, c.text) for c in item.content or ()] == [("reasoning_text", THOUGHT)]
    assert response.output_text == "Hello"  # the SDK's helper reads the message only


def test_a_responses_answer_cut_by_length_marks_its_reasoning_incomplete() -> None:
    chat = _answer({"content": "", "reasoning_content": THOUGHT}, finish="length")
    response = openai_responses.from_chat_response(chat, model="m")
    assert response["status"] == "incomplete"
    assert [i["status"] for i in response["output"]] == ["incomplete", "incomplete"]


def test_a_responses_answer_without_reasoning_has_no_reasoning_item() -> None:
    response = openai_responses.from_chat_response(_answer({"content": "Hello"}), model="m")
    assert [i["type"] for i in response["output"]] == ["message"]


def test_a_responses_stream_with_reasoning_streams_a_reasoning_item_first() -> None:
    # No reasoning events: the message item was output 0 and the call output 1.
    events = _frames(ChatToResponsesStream("m"), STREAM)
    for event in events:
        _RESPONSES_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))

    added = [(e["output_index"], e["item"]) for e in events if e["type"].endswith("item.added")]
    assert [(i, item["type"]) for i, item in added] == [
        (0, "reasoning"),
        (1, "message"),
        (2, "function_call"),
    ]
    assert added[0][1]["content"] == [] and added[0][1]["summary"] == []
    rs_id = added[0][1]["id"]
    reasoning = [e for e in events if e["type"].startswith("response.reasoning_text")]
    assert [(e["type"], e.get("delta", e.get("text"))) for e in reasoning] == [
        ("response.reasoning_text.delta", THOUGHT),
        ("response.reasoning_text.delta", MORE),
        ("response.reasoning_text.done", THOUGHT + MORE),
    ]
    assert all(
        (e["item_id"], e["output_index"], e["content_index"]) == (rs_id, 0, 0) for e in reasoning
    )
    parts = [
        e
        for e in events
        if e["type"].startswith("response.content_part") and e["output_index"] == 0
    ]
    assert [(e["type"], e["part"]) for e in parts] == [
        ("response.content_part.added", {"type": "reasoning_text", "text": ""}),
        ("response.content_part.done", {"type": "reasoning_text", "text": THOUGHT + MORE}),
    ]
    kinds = [e["type"] for e in events]
    first_done = kinds.index("response.output_item.done")
    assert events[first_done]["output_index"] == 0  # closed before the message item opens
    assert first_done < kinds.index("response.output_text.delta")

    final = Response.model_validate(events[-1]["response"])
    plain = Response.model_validate(
        openai_responses.from_chat_response(
            _answer(
                {"content": "Hello", "reasoning_content": THOUGHT + MORE, "tool_calls": [CALL]}
            ),
            model="m",
        )
    )
    assert _shape(final) == _shape(plain)


def test_a_responses_stream_cut_during_reasoning_keeps_it_as_incomplete() -> None:
    stream = ChatToResponsesStream("m")
    frames = [f for c in STREAM[:2] for f in stream.feed(c)] + stream.error("cut")
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in frames]
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["output"][0]["status"] == "incomplete"
    assert failed["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT + MORE}]


def _shape(response: Response) -> list[Any]:
    """A response's output without its minted ids."""
    return [item.model_dump(exclude={"id", "call_id"}) for item in response.output]
