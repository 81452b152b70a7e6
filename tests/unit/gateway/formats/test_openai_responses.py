"""gateway.formats.openai_responses: Responses requests in, chat answers and streams out.

Shapes are proven with the official ``openai`` SDK: its pydantic models, and its own
Responses stream accumulator fed our frames through an in-memory transport.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.responses import Response, ResponseStreamEvent

from gateway.formats.openai_responses import (
    ChatToResponsesStream,
    error_body,
    from_chat_response,
    to_chat_request,
)
from gateway.steering.labels import conversation_key
from schemas import InvalidRequestError, UpstreamBadResponseError
from tests.fixtures.wire_files import answering_sse, chat_chunks, drain, load_wire, sse_frames

JSON = dict[str, Any]
_STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_CHAT_REQUEST = pydantic.TypeAdapter(CompletionCreateParamsStreaming)


def _sdk_client(body: bytes) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=answering_sse(body),
    )


def _chunk(delta: JSON | None = None, finish: str | None = None) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def _completion(message: JSON, finish: str | None) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "up",
        "choices": [
            {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}
        ],
    }


def _minimal(**extra: Any) -> JSON:
    body: JSON = {"model": "gpt-x", "input": "hi"}
    body.update(extra)
    return body


# --- requests -------------------------------------------------------------------------------


def test_to_chat_request_with_recorded_codex_body_gives_valid_chat_request() -> None:
    chat = to_chat_request(load_wire("responses_request_codex.json"))

    drain(_CHAT_REQUEST.validate_python(chat))
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "user", "assistant", "tool", "tool"]
    # instructions and the developer message become one system message
    system = chat["messages"][0]["content"]
    assert system.startswith("You are Codex")
    assert system.endswith(
        "\n\n<permissions instructions>sandbox_mode: workspace-write</permissions instructions>"
    )
    image = chat["messages"][2]["content"][1]
    assert image == {
        "type": "image_url",
        "image_url": {
            "url": load_wire("responses_request_codex.json")["input"][2]["content"][1]["image_url"],
            "detail": "auto",
        },
    }
    assistant = chat["messages"][3]
    assert assistant["content"] == "Let me look at the build script."
    assert [(c["id"], c["function"]["name"]) for c in assistant["tool_calls"]] == [
        ("call_Zq1rT8", "shell"),
        ("call_Zq2kP4", "shell"),
    ]
    assert chat["messages"][4] == {
        "role": "tool",
        "tool_call_id": "call_Zq1rT8",
        "content": "all:\n\tgcc -o app main.c",
    }
    assert chat["messages"][5]["tool_call_id"] == "call_Zq2kP4"


def test_to_chat_request_maps_parameters() -> None:
    chat = to_chat_request(load_wire("responses_request_codex.json"))

    assert chat["model"] == "gpt-5-codex"
    assert chat["max_tokens"] == 8192
    assert chat["tool_choice"] == "auto"
    assert chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "medium"
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "Runs a shell command and returns its output.",
                "strict": False,
                "parameters": load_wire("responses_request_codex.json")["tools"][0]["parameters"],
            },
        }
    ]
    # Codex keys its prompt cache by conversation: sent on, as chat takes it.
    assert chat["prompt_cache_key"] == "0199a213-81c0-7800-8aa1-bbab2a035a53"
    for dropped in ("store", "include", "reasoning", "input"):
        assert dropped not in chat


def test_to_chat_request_with_string_input_and_store_true_is_accepted() -> None:
    chat = to_chat_request(_minimal(instructions="Be terse.", store=True, temperature=0.3))

    assert chat == {
        "model": "gpt-x",
        "temperature": 0.3,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
    }


def test_to_chat_request_keeps_a_mid_conversation_developer_message_in_place() -> None:
    chat = to_chat_request(
        _minimal(
            instructions="Base.",
            input=[
                {"role": "user", "content": "a"},
                {"role": "developer", "content": "Now be brief."},
                {"role": "user", "content": "b"},
            ],
        )
    )

    assert chat["messages"] == [
        {"role": "system", "content": "Base."},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Now be brief."},
        {"role": "user", "content": "b"},
    ]


def test_to_chat_request_puts_tool_output_images_after_the_tool_messages() -> None:
    chat = to_chat_request(
        _minimal(
            input=[
                {"type": "function_call", "call_id": "c1", "name": "view", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "view", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [
                        {"type": "input_text", "text": "here"},
                        {
                            "type": "input_image",
                            "image_url": "https://x.test/a.png",
                            "detail": "low",
                        },
                    ],
                },
                {"type": "function_call_output", "call_id": "c2", "output": "ok"},
                {"role": "user", "content": "next"},
            ]
        )
    )

    assert [m["role"] for m in chat["messages"]] == ["assistant", "tool", "tool", "user", "user"]
    assert chat["messages"][1]["content"] == "here"
    assert chat["messages"][3]["content"] == [
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "low"}}
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("required", "required"),
        (
            {"type": "function", "name": "shell"},
            {"type": "function", "function": {"name": "shell"}},
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "shell"}],
            },
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [{"type": "function", "function": {"name": "shell"}}],
                },
            },
        ),
    ],
)
def test_to_chat_request_maps_tool_choice(choice: Any, expected: Any) -> None:
    body = _minimal(
        tools=[{"type": "function", "name": "shell", "parameters": None, "strict": None}],
        tool_choice=choice,
    )

    assert to_chat_request(body)["tool_choice"] == expected


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "name": "shell"}, {"type": "custom", "name": "patch"}],
    ids=["required", "a-function", "a-custom-tool"],
)
@pytest.mark.parametrize("tools", [None, []], ids=["no-tools", "empty-tools"])
def test_a_tool_choice_asking_for_a_call_without_tools_is_refused(
    choice: Any, tools: list[Any] | None
) -> None:
    """It was dropped with the absent tools: the model just chatted, where OpenAI answers a
    400 ("Tool choice 'required' must be specified with 'tools' parameter")."""
    body = _minimal(tool_choice=choice) if tools is None else _minimal(tools=tools)
    body["tool_choice"] = choice

    with pytest.raises(InvalidRequestError) as exc:
        to_chat_request(body)

    assert exc.value.param == "tool_choice"


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_tool_choice_asking_for_no_call_without_tools_is_dropped(choice: str) -> None:
    assert "tool_choice" not in to_chat_request(_minimal(tool_choice=choice))


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": True},
            {
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_to_chat_request_maps_text_format(fmt: JSON, expected: Any) -> None:
    chat = to_chat_request(_minimal(text={"format": fmt}))

    assert chat.get("response_format") == expected


def test_to_chat_request_with_previous_response_id_says_the_gateway_is_stateless() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        to_chat_request(_minimal(previous_response_id="resp_123"))

    assert caught.value.param == "previous_response_id"
    assert "stateless" in caught.value.message


def test_to_chat_request_with_hosted_tools_names_them() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        to_chat_request(
            _minimal(
                tools=[
                    {"type": "function", "name": "f", "parameters": {}, "strict": True},
                    {"type": "web_search"},
                    {"type": "file_search", "vector_store_ids": ["vs_1"]},
                ]
            )
        )

    assert caught.value.param == "tools[1].type"
    assert "file_search" in caught.value.message and "web_search" in caught.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        (_minimal(input=None), "input"),
        (_minimal(input=[]), "input"),
        (_minimal(conversation="conv_1"), "conversation"),
        (_minimal(prompt={"id": "pmpt_1"}), "prompt"),
        (_minimal(background=True), "background"),
        (_minimal(top_logprobs=5), "top_logprobs"),
        (_minimal(instructions=["x"]), "instructions"),
        (_minimal(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
        (_minimal(input=[{"type": "web_search_call", "id": "ws_1"}]), "input[0].type"),
        (_minimal(input=[{"type": {}, "role": "user", "content": "x"}]), "input[0].type"),
        (_minimal(input=[{"type": ["message"], "content": "x"}]), "input[0].type"),
        (_minimal(input=[{"role": "tool", "content": "x"}]), "input[0].role"),
        (
            _minimal(
                input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]
            ),
            "input[0].content[0].image_url",
        ),
        (
            _minimal(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
            "input[0].content[0].file_data",
        ),
        (
            _minimal(
                input=[
                    {
                        "role": "system",
                        "content": [{"type": "input_image", "image_url": "https://x"}],
                    }
                ]
            ),
            "input[0].content[0].type",
        ),
        (
            _minimal(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "input[0].call_id",
        ),
        (_minimal(input=[{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
        (
            _minimal(tools=[{"type": "function", "name": "f"}], tool_choice={"type": "web_search"}),
            "tool_choice.type",
        ),
        (_minimal(text={"format": {"type": "yaml"}}), "text.format.type"),
        (_minimal(max_output_tokens=0), "max_output_tokens"),
        (_minimal(stream=1), "stream"),
        (_minimal(temperature="hot"), "temperature"),
        (_minimal(truncation="middle"), "truncation"),
        (_minimal(store="yes"), "store"),
        (_minimal(metadata=["x"]), "metadata"),
        (_minimal(user=7), "user"),
        (_minimal(tool_choice=3), "tool_choice"),
        (_minimal(tools=["x"]), "tools[0]"),
        (_minimal(tools=[{"type": "function", "name": "f"}, None]), "tools[1]"),
        (_minimal(tools=[{"type": "function", "name": "f", "strict": "yes"}]), "tools[0].strict"),
        (
            _minimal(tools=[{"type": "function", "name": "f", "description": 5}]),
            "tools[0].description",
        ),
        (
            _minimal(
                text={"format": {"type": "json_schema", "name": "r", "schema": {}, "strict": 1}}
            ),
            "text.format.strict",
        ),
    ],
)
def test_to_chat_request_with_invalid_input_names_the_param(body: JSON, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        to_chat_request(body)

    assert caught.value.param == param


# --- answers --------------------------------------------------------------------------------


def test_from_chat_response_with_recorded_tool_calls_is_a_valid_response() -> None:
    request = _minimal(
        instructions="Be terse.",
        tools=[
            {
                "type": "function",
                "name": "get_current_weather",
                "parameters": {"type": "object"},
                "strict": True,
            }
        ],
        tool_choice="auto",
        temperature=0.5,
    )

    out = from_chat_response(
        load_wire("chat_completion_tool_calls.json"), model="gpt-x", request=request
    )

    resp = Response.model_validate(out)
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert (resp.status, resp.model, resp.created_at) == ("completed", "gpt-x", 1699896916)
    assert resp.output_text == "Let me look that up."
    call = resp.output[1]
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.status) == (
        "call_abc123",
        "get_current_weather",
        "completed",
    )
    assert json.loads(call.arguments) == {"location": "Boston, MA"}
    assert call.id is not None and call.id.startswith("fc_")
    assert resp.instructions == "Be terse." and resp.temperature == 0.5
    assert resp.tools[0].type == "function" and resp.tools[0].name == "get_current_weather"
    assert resp.usage is not None
    assert (
        resp.usage.input_tokens,
        resp.usage.output_tokens,
        resp.usage.total_tokens,
        resp.usage.input_tokens_details.cached_tokens,
    ) == (2082, 17, 2099, 1920)
    assert resp.usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize(
    ("finish", "status", "reason"),
    [
        ("stop", "completed", None),
        ("tool_calls", "completed", None),
        (None, "completed", None),
        ("length", "incomplete", "max_output_tokens"),
        ("content_filter", "incomplete", "content_filter"),
    ],
)
def test_from_chat_response_maps_finish_reason_to_status(
    finish: str | None, status: str, reason: str | None
) -> None:
    resp = Response.model_validate(
        from_chat_response(_completion({"content": "hi"}, finish), model="m")
    )

    assert resp.status == status
    assert (resp.incomplete_details.reason if resp.incomplete_details else None) == reason
    assert resp.output[0].type == "message" and resp.output[0].status == (
        "completed" if status == "completed" else "incomplete"
    )


# What OpenAI's API echoes for each setting a request leaves out (its answer to a bare
# ``{"model", "input"}``): a client reading ``response.temperature`` reads 1.0, not None.
OPENAI_DEFAULTS: JSON = {
    "background": False,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}
# Each setting given, as OpenAI echoes it back.
GIVEN: JSON = {
    "instructions": "Be terse.",
    "max_output_tokens": 300,
    "max_tool_calls": 4,
    "metadata": {"ticket": "T-1"},
    "parallel_tool_calls": False,
    "prompt_cache_key": "conv-1",
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low", "summary": "auto"},
    "safety_identifier": "user-7f3a",
    "service_tier": "flex",
    "store": False,
    "temperature": 0.2,
    "text": {
        "format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}},
        "verbosity": "low",
    },
    "tool_choice": {"type": "function", "name": "f"},
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
    "top_p": 0.9,
    "truncation": "auto",
    "user": "u-1",
}


def _echoed(response: JSON) -> JSON:
    return {key: response[key] for key in OPENAI_DEFAULTS}


def test_a_response_echoes_what_openai_echoes_for_settings_left_out() -> None:
    plain = from_chat_response(
        _completion({"content": "hi"}, "stop"), model="m", request=_minimal()
    )
    stream = ChatToResponsesStream("m", request=_minimal())
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in stream.finish()]

    assert _echoed(plain) == OPENAI_DEFAULTS
    assert _echoed(events[0]["response"]) == _echoed(events[-1]["response"]) == OPENAI_DEFAULTS
    resp = Response.model_validate(plain)
    assert (resp.temperature, resp.top_p, resp.metadata) == (1.0, 1.0, {})


def test_a_response_echoes_each_setting_the_request_gave() -> None:
    out = from_chat_response(
        _completion({"content": "{}"}, "stop"), model="m", request=_minimal(**GIVEN)
    )

    assert {key: out[key] for key in GIVEN} == GIVEN
    Response.model_validate(out)


def test_a_text_setting_giving_only_its_verbosity_keeps_the_text_format() -> None:
    out = from_chat_response(
        _completion({"content": "hi"}, "stop"),
        model="m",
        request=_minimal(text={"verbosity": "high"}, reasoning={"effort": "high"}),
    )

    assert out["text"] == {"format": {"type": "text"}, "verbosity": "high"}
    assert out["reasoning"] == {"effort": "high", "summary": None}


@pytest.mark.parametrize(
    ("asked", "shown"), [(None, "default"), ("auto", "default"), ("flex", "flex")]
)
def test_the_service_tier_shown_is_the_one_that_served(asked: str | None, shown: str) -> None:
    # As OpenAI: the tier asked (``auto`` names none: ``default``), the upstream's when its
    # answer says which served.
    request = _minimal(service_tier=asked)
    served = {**_completion({"content": "hi"}, "stop"), "service_tier": "priority"}
    stream = ChatToResponsesStream("m", request=request)
    frames = stream.feed({**_chunk({"content": "hi"}), "service_tier": "priority"})
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in [*frames, *stream.finish()]]
    unsaid = from_chat_response(_completion({}, "stop"), model="m", request=request)

    assert unsaid["service_tier"] == events[0]["response"]["service_tier"] == shown
    assert from_chat_response(served, model="m", request=request)["service_tier"] == "priority"
    assert events[-1]["response"]["service_tier"] == "priority"


def test_from_chat_response_with_refusal_gives_a_refusal_part() -> None:
    out = from_chat_response(_completion({"content": None, "refusal": "No."}, "stop"), model="m")

    resp = Response.model_validate(out)
    assert resp.output[0].type == "message"
    assert [p.type for p in resp.output[0].content] == ["refusal"]


def test_from_chat_response_without_usage_has_no_usage() -> None:
    assert from_chat_response(_completion({"content": "hi"}, "stop"), model="m")["usage"] is None


def test_from_chat_response_without_message_raises_bad_response() -> None:
    with pytest.raises(UpstreamBadResponseError):
        from_chat_response({"choices": [{"index": 0}]}, model="m")


# --- streams --------------------------------------------------------------------------------


def _run(stream: ChatToResponsesStream, chunks: list[JSON]) -> bytes:
    frames: list[bytes] = []
    for chunk in chunks:
        frames += stream.feed(chunk)
    return b"".join(frames)


def test_stream_of_recorded_chunks_is_valid_and_accumulates_in_the_sdk() -> None:
    stream = ChatToResponsesStream("gpt-x", request=_minimal())
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse")) + b"".join(stream.finish())

    frames = sse_frames(raw)
    for event, data in frames:
        assert _STREAM_EVENT.validate_python(data).type == event
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    names = [e for e, _ in frames]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-1] == "response.completed"
    with _sdk_client(raw).responses.stream(model="gpt-x", input="hi") as s:
        for _ in s:
            pass
        resp = s.get_final_response()
    assert resp.output_text == "Checking both cities."
    calls = [(o.call_id, json.loads(o.arguments)) for o in resp.output if o.type == "function_call"]
    assert calls == [
        ("call_DdmO9pD3xa9XTPNJ32zg2hcA", {"location": "Paris"}),
        ("call_f3Ok4lj3cNXWc1qN2jWbZGxL", {"location": "Bogotá"}),
    ]
    assert resp.usage is not None
    assert (
        resp.usage.input_tokens,
        resp.usage.input_tokens_details.cached_tokens,
        resp.usage.output_tokens,
    ) == (182, 128, 64)


def test_stream_sends_argument_fragments_in_order_per_item() -> None:
    stream = ChatToResponsesStream("m")
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse"))

    deltas = [
        (d["output_index"], d["delta"])
        for e, d in sse_frames(raw)
        if e == "response.function_call_arguments.delta"
    ]
    assert deltas == [(1, '{"lo'), (1, 'cation": "Paris"}'), (2, '{"location":'), (2, ' "Bogotá"}')]
    done = [
        (d["output_index"], d["arguments"])
        for e, d in sse_frames(raw)
        if e == "response.function_call_arguments.done"
    ]
    assert done == [(1, '{"location": "Paris"}')]  # the second closes at finish


def test_stream_cut_by_length_ends_incomplete() -> None:
    stream = ChatToResponsesStream("m")
    raw = _run(stream, [_chunk({"content": "Once upon"}), _chunk(finish="length")])
    raw += b"".join(stream.finish())

    event, data = sse_frames(raw)[-1]
    assert event == "response.incomplete"
    resp = Response.model_validate(data["response"])
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].type == "message" and resp.output[0].status == "incomplete"


def test_stream_with_refusal_streams_a_refusal_part() -> None:
    stream = ChatToResponsesStream("m")
    raw = _run(
        stream,
        [_chunk({"refusal": "I can't"}), _chunk({"refusal": " help."}), _chunk(finish="stop")],
    ) + b"".join(stream.finish())

    frames = sse_frames(raw)
    for _, data in frames:
        _STREAM_EVENT.validate_python(data)
    done = next(d for e, d in frames if e == "response.refusal.done")
    assert done["refusal"] == "I can't help."
    final = Response.model_validate(frames[-1][1]["response"])
    assert final.output[0].type == "message"
    assert final.output[0].content[0].type == "refusal"


def test_stream_cut_mid_answer_fails_and_never_completes() -> None:
    stream = ChatToResponsesStream("m")
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse")[:5])
    raw += b"".join(stream.error("upstream connection reset"))

    frames = sse_frames(raw)
    for _, data in frames:
        _STREAM_EVENT.validate_python(data)
    names = [e for e, _ in frames]
    assert names[-2:] == ["error", "response.failed"]
    assert "response.completed" not in names
    failed = Response.model_validate(frames[-1][1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.message) == (
        "server_error",
        "upstream connection reset",
    )
    assert failed.output[-1].type == "function_call"
    assert failed.output[-1].status == "incomplete"
    assert stream.finish() == [] and stream.feed(_chunk({"content": "x"})) == []
    with _sdk_client(raw).responses.stream(model="m", input="hi") as s:
        seen = [event.type for event in s]
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            s.get_final_response()
    assert seen[-1] == "response.failed"


def test_stream_finished_without_chunks_is_a_complete_empty_response() -> None:
    raw = b"".join(ChatToResponsesStream("m").finish())

    frames = sse_frames(raw)
    assert [e for e, _ in frames] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert Response.model_validate(frames[-1][1]["response"]).output == []


# --- errors ---------------------------------------------------------------------------------


def test_error_body_has_the_openai_shape() -> None:
    assert error_body(400, "bad tools", "tools[0].type") == {
        "error": {
            "message": "bad tools",
            "type": "invalid_request_error",
            "param": "tools[0].type",
            "code": None,
        }
    }
    assert error_body(429, "slow down", code="rate_limit_exceeded")["error"]["type"] == (
        "rate_limit_error"
    )


def test_a_responses_prompt_cache_key_keys_the_conversations_affinity() -> None:
    # Dropped before: a Codex conversation was keyed by its opening messages instead.
    first = to_chat_request(_minimal(prompt_cache_key="conv-1"))
    later = to_chat_request(_minimal(prompt_cache_key="conv-1", input="another opening"))

    unkeyed = conversation_key(to_chat_request(_minimal()))
    assert conversation_key(first) == conversation_key(later) != unkeyed
