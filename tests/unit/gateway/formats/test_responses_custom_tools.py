"""Custom (freeform) tools on the Responses surface: Codex's ``apply_patch``.

Requests become chat's custom tools (``{"type": "custom", "custom": {...}}``); chat custom tool
calls come back as ``custom_tool_call`` items, whole or streamed
(``response.custom_tool_call_input.delta``/``.done``), checked against the ``openai`` SDK's
own types and its stream accumulator.
"""

from __future__ import annotations

from typing import Any

import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent

from gateway.formats.openai_responses import (
    ChatToResponsesStream,
    from_chat_response,
    to_chat_request,
)
from schemas import InvalidRequestError, UpstreamBadResponseError
from tests.fixtures.wire_files import answering_sse, sse_frames

JSON = dict[str, Any]
_STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}
_APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch",
    "format": _GRAMMAR,
}
_PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"


def _request(**extra: Any) -> JSON:
    return {"model": "gpt-5", "input": "patch it", **extra}


def _chunk(delta: JSON | None = None, finish: str | None = None) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-5",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def _custom_delta(index: int, **fields: Any) -> JSON:
    call: JSON = {"index": index}
    custom = {k: fields.pop(k) for k in ("name", "input") if k in fields}
    call.update(fields)
    call["custom"] = custom
    return {"tool_calls": [call]}


def _sdk_client(body: bytes) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=answering_sse(body),
    )


def test_custom_tool_with_grammar_becomes_a_chat_custom_tool() -> None:
    text_tool = {"type": "custom", "name": "note", "format": {"type": "text"}}
    chat = to_chat_request(_request(tools=[_APPLY_PATCH, text_tool]))

    assert chat["tools"] == [
        {
            "type": "custom",
            "custom": {"name": "apply_patch", "description": "Apply a patch", "format": _GRAMMAR},
        },
        {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}},
    ]


def test_custom_tool_choice_and_allowed_custom_tool_become_chat_custom_choices() -> None:
    named = to_chat_request(
        _request(tools=[_APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"})
    )
    allowed = to_chat_request(
        _request(
            tools=[_APPLY_PATCH],
            tool_choice={
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "custom", "name": "apply_patch"}],
            },
        )
    )

    assert named["tool_choice"] == {"type": "custom", "custom": {"name": "apply_patch"}}
    assert allowed["tool_choice"]["allowed_tools"]["tools"] == [
        {"type": "custom", "custom": {"name": "apply_patch"}}
    ]


def test_custom_tool_call_and_output_items_become_a_chat_call_and_tool_message() -> None:
    items = [
        {"role": "user", "content": "patch it"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_1",
            "name": "apply_patch",
            "input": _PATCH,
        },
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"},
    ]
    chat = to_chat_request(_request(input=items, tools=[_APPLY_PATCH]))

    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "custom",
                    "custom": {"name": "apply_patch", "input": _PATCH},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Done!"},
    ]


def test_custom_tool_call_item_without_a_string_input_is_refused_at_its_path() -> None:
    items = [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": 3}]

    with pytest.raises(InvalidRequestError) as info:
        to_chat_request(_request(input=items))

    assert info.value.param == "input[0].input"


def test_hosted_tool_next_to_a_custom_tool_is_still_refused() -> None:
    with pytest.raises(InvalidRequestError, match="web_search") as info:
        to_chat_request(_request(tools=[_APPLY_PATCH, {"type": "web_search"}]))

    assert info.value.param == "tools[1].type"


def test_chat_custom_tool_call_answer_becomes_a_custom_tool_call_item() -> None:
    chat = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-5",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "custom",
                            "custom": {"name": "apply_patch", "input": _PATCH},
                        }
                    ],
                },
            }
        ],
    }
    ChatCompletion.model_validate(chat)  # the shape chat completions answers

    out = from_chat_response(chat, model="gpt-5", request=_request(tools=[_APPLY_PATCH]))

    item = Response.model_validate(out).output[0]
    assert item.type == "custom_tool_call"
    assert (item.call_id, item.name, item.input) == ("call_9", "apply_patch", _PATCH)
    assert out["output"][0]["status"] == "completed"
    assert out["output"][0]["id"].startswith("ctc_")


def test_chat_custom_tool_call_without_its_custom_object_is_a_bad_response() -> None:
    chat = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]},
            }
        ]
    }
    with pytest.raises(UpstreamBadResponseError, match="custom"):
        from_chat_response(chat, model="gpt-5")


def _custom_stream() -> bytes:
    stream = ChatToResponsesStream("gpt-5", request=_request(tools=[_APPLY_PATCH]))
    chunks = [
        _chunk({"role": "assistant", "content": "Patching."}),
        _chunk(_custom_delta(0, id="call_7", type="custom", name="apply_patch", input="")),
        _chunk(_custom_delta(0, input=_PATCH[:16])),
        _chunk(_custom_delta(0, input=_PATCH[16:])),
        _chunk(finish="tool_calls"),
    ]
    return b"".join(b"".join(stream.feed(c)) for c in chunks) + b"".join(stream.finish())


def test_streamed_chat_custom_tool_call_becomes_custom_tool_call_events() -> None:
    frames = sse_frames(_custom_stream())

    for _, data in frames:
        _STREAM_EVENT.validate_python(data)
    events = [e for e, _ in frames]
    start = events.index("response.output_item.added", events.index("response.output_text.done"))
    assert events[start:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = frames[start][1]["item"]
    assert (added["type"], added["input"], added["call_id"]) == ("custom_tool_call", "", "call_7")
    done = frames[start + 3][1]
    assert done["input"] == _PATCH and done["item_id"] == added["id"]
    assert done["output_index"] == 1


def test_streamed_custom_tool_call_is_accumulated_by_the_sdk() -> None:
    with _sdk_client(_custom_stream()).responses.stream(model="gpt-5", input="hi") as s:
        for _ in s:
            pass
        resp = s.get_final_response()

    assert resp.output_text == "Patching."
    calls = [(o.call_id, o.name, o.input) for o in resp.output if o.type == "custom_tool_call"]
    assert calls == [("call_7", "apply_patch", _PATCH)]


def test_stream_cut_during_a_custom_tool_call_keeps_its_input_so_far() -> None:
    stream = ChatToResponsesStream("gpt-5")
    stream.feed(_chunk(_custom_delta(0, id="call_7", type="custom", name="apply_patch")))
    stream.feed(_chunk(_custom_delta(0, input="*** Begin")))

    failed = sse_frames(b"".join(stream.error("cut")))[-1][1]["response"]

    assert failed["output"][0]["type"] == "custom_tool_call"
    assert failed["output"][0]["input"] == "*** Begin"
    assert failed["output"][0]["status"] == "incomplete"
