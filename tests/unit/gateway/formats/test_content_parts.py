"""A canonical ``content`` given as a list of parts, read by the translating surfaces.

``plain_content`` is the one rule (text parts the text, refusal parts the refusal, thinking
parts the reasoning, other parts not shown); the Responses and Messages renderers, streamed
and whole, apply it (how they render the reasoning: ``test_reasoning.py``). Their frames are
checked against the official SDKs' event types. Also: a renderer whose ``finish`` fails still
ends the stream through ``error``.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from gateway.formats import _canonical_to_anthropic, _canonical_to_responses
from gateway.formats._common import plain_content
from gateway.formats.anthropic_messages import ChatToMessagesStream
from gateway.formats.anthropic_messages import from_chat_response as to_message
from gateway.formats.openai_responses import ChatToResponsesStream
from gateway.formats.openai_responses import from_chat_response as to_response

JSON = dict[str, Any]
_RESPONSES_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_MESSAGES_EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)

TEXT = {"type": "text", "text": "Hel"}
THOUGHT = "The user greets me."
THINKING = {"type": "thinking", "thinking": [{"type": "text", "text": THOUGHT}]}
REFUSAL = {"type": "refusal", "refusal": "No."}
REFERENCE = {"type": "reference", "reference_ids": [1]}


@pytest.mark.parametrize(
    ("message", "plain"),
    [
        ({"content": [TEXT, {"type": "text", "text": "lo"}]}, {"content": "Hello"}),
        (
            {"role": "assistant", "content": [THINKING, TEXT]},
            {"role": "assistant", "content": "Hel", "reasoning_content": THOUGHT},
        ),
        (
            {"content": [{"type": "thinking", "thinking": "Hmm"}]},
            {"content": "", "reasoning_content": "Hmm"},
        ),
        ({"content": [REFUSAL]}, {"content": "", "refusal": "No."}),
        ({"content": [REFUSAL], "refusal": "I "}, {"content": "", "refusal": "I No."}),
        ({"content": [REFERENCE, TEXT, {"type": "image_url"}]}, {"content": "Hel"}),
        # The seam refuses these; the rule still never raises on them.
        ({"content": ["x", 5, None, {"type": "text", "text": 5}, TEXT]}, {"content": "Hel"}),
        ({"content": [{"type": "thinking", "thinking": ["x", {"type": "text"}]}]}, {"content": ""}),
    ],
)
def test_plain_content_reads_text_refusal_and_thinking_parts_and_skips_the_rest(
    message: JSON, plain: JSON
) -> None:
    before = json.dumps(message)
    assert plain_content(message) == plain
    assert json.dumps(message) == before  # a copy: the chat surface's answer is untouched


def _chunk(delta: JSON, finish: str | None = None) -> JSON:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


MISTRAL = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": [THINKING]}),
    _chunk({"content": [TEXT]}),
    _chunk({"content": [{"type": "text", "text": "lo"}]}),
    _chunk({"content": [REFUSAL]}),
    _chunk({}, "stop"),
]


def _frames(renderer: Any, chunks: list[JSON]) -> list[JSON]:
    frames = [f for c in chunks for f in renderer.feed(c)] + renderer.finish()
    return [json.loads(f.split(b"data: ", 1)[1]) for f in frames]


def test_a_responses_stream_of_parts_gives_text_and_refusal_deltas_and_completes() -> None:
    # The list itself was the output_text delta, and finish failed joining it: the stream
    # ended with no terminal event.
    events = _frames(ChatToResponsesStream("m"), MISTRAL)
    for event in events:
        _RESPONSES_EVENT.validate_python(event)
    deltas = [(e["type"], e["delta"]) for e in events if e["type"].endswith(".delta")]
    assert deltas == [
        ("response.reasoning_text.delta", THOUGHT),  # the thinking part: reasoning
        ("response.output_text.delta", "Hel"),
        ("response.output_text.delta", "lo"),
        ("response.refusal.delta", "No."),
    ]
    assert events[-1]["type"] == "response.completed"
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert [p.get("text", p.get("refusal")) for p in message["content"]] == ["Hello", "No."]


def test_a_messages_stream_of_parts_gives_text_deltas_and_stops() -> None:
    # The list itself was the text_delta's text.
    events = _frames(ChatToMessagesStream("m"), MISTRAL)
    for event in events:
        if event["type"] != "ping":  # not one of the SDK's message events
            _MESSAGES_EVENT.validate_python(event)
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert [d.get("text", d.get("thinking")) for d in deltas] == [THOUGHT, "Hel", "lo", "No."]
    assert deltas[0]["type"] == "thinking_delta"  # the thinking part: reasoning
    assert events[-1]["type"] == "message_stop"


def _answer(content: Any) -> JSON:
    message = {"role": "assistant", "content": content}
    return {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


def test_a_whole_answer_of_parts_gives_responses_its_text_and_refusal() -> None:
    # Refusal parts were dropped: an empty output_text, "completed".
    response = to_response(_answer([THINKING, TEXT, REFUSAL]), model="m")
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert response["output"][1]["content"] == [
        {"type": "output_text", "text": "Hel", "annotations": [], "logprobs": []},
        {"type": "refusal", "refusal": "No."},
    ]


def test_a_whole_answer_of_refusal_parts_is_a_messages_refusal() -> None:
    # Dropped: no content at all, "end_turn".
    message = to_message(_answer([REFUSAL]), model="m")
    assert (message["content"], message["stop_reason"]) == (
        [{"type": "text", "text": "No."}],
        "refusal",
    )


def test_a_responses_finish_that_fails_still_lets_error_end_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # finish marked itself done before failing, so error() gave nothing: no terminal event.
    renderer = ChatToResponsesStream("m")
    renderer.feed(_chunk({"content": "Hel"}))
    monkeypatch.setattr(_canonical_to_responses, "_finalise", _fail)
    with pytest.raises(RuntimeError):
        renderer.finish()
    assert not renderer.done
    events = [
        json.loads(f.split(b"data: ", 1)[1]) for f in renderer.error("internal gateway error")
    ]
    assert [e["type"] for e in events] == ["error", "response.failed"]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hel"  # kept, cut
    assert renderer.done and renderer.error("again") == []


def test_a_responses_error_that_cannot_keep_the_output_still_fails_the_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renderer = ChatToResponsesStream("m")
    renderer.feed(_chunk({"content": "Hel"}))
    monkeypatch.setattr(ChatToResponsesStream, "_done_part", _fail)  # what failed finish
    with pytest.raises(RuntimeError):
        renderer.finish()
    events = [
        json.loads(f.split(b"data: ", 1)[1]) for f in renderer.error("internal gateway error")
    ]
    assert [e["type"] for e in events] == ["error", "response.failed"]
    assert events[-1]["response"]["output"] == []


def test_a_messages_finish_that_fails_still_lets_error_end_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renderer = ChatToMessagesStream("m")
    renderer.feed(_chunk({"content": "Hel"}))
    monkeypatch.setattr(_canonical_to_anthropic, "stop_reason", _fail)
    with pytest.raises(RuntimeError):
        renderer.finish()
    frames = renderer.error("internal gateway error")
    assert len(frames) == 1 and frames[0].startswith(b"event: error")


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a gateway bug")
