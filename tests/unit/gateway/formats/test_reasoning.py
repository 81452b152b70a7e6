"""Canonical reasoning (``reasoning_content``, OpenRouter's ``reasoning``, Mistral's thinking
parts) rendered by the translating surfaces: a Messages ``thinking`` block, whole and
streamed. Each frame and answer is checked against the official SDK's types.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import pydantic
import pytest

from gateway.formats import anthropic_messages
from gateway.formats.anthropic_messages import ChatToMessagesStream

JSON = dict[str, Any]
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
