"""gateway.formats.anthropic_messages: Messages requests in, chat answers and streams out.

Shapes are proven with the official ``anthropic`` SDK: its pydantic models, and its own stream
accumulator fed our frames through an in-memory transport.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

from gateway.formats.anthropic_messages import (
    ChatToMessagesStream,
    error_body,
    from_chat_response,
    to_chat_request,
)
from schemas import InvalidRequestError, UpstreamBadResponseError
from tests.fixtures.wire_files import answering_sse, chat_chunks, drain, load_wire, sse_frames

JSON = dict[str, Any]
_STREAM_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
_CHAT_REQUEST = pydantic.TypeAdapter(CompletionCreateParamsStreaming)


def _sdk_client(body: bytes) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=answering_sse(body),
    )


def _chunk(delta: JSON | None = None, finish: str | None = None, **extra: Any) -> JSON:
    choice: JSON = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    choice.update(extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream",
        "choices": [choice],
    }


def _completion(message: JSON, finish: str | None, **choice_extra: Any) -> JSON:
    choice: JSON = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
    }
    choice.update(choice_extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "up",
        "choices": [choice],
    }


# --- requests -------------------------------------------------------------------------------


def test_to_chat_request_with_recorded_claude_code_body_gives_valid_chat_request() -> None:
    chat = to_chat_request(load_wire("anthropic_request_claude_code.json"))

    drain(_CHAT_REQUEST.validate_python(chat))
    messages = chat["messages"]
    mark = {"cache_control": {"type": "ephemeral"}}  # kept: Claude caches what is marked
    assert messages[0] == {
        "role": "system",
        "content": [
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                **mark,
            },
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software "
                "engineering tasks.",
                **mark,
            },
        ],
    }
    user = messages[1]
    assert user["role"] == "user"
    assert [p["type"] for p in user["content"]] == ["text", "text", "image_url"]
    assert user["content"][2]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0K")
    assistant = messages[2]
    assert assistant["content"] == (
        "The screenshot shows a terminal with a failing build. Let me list the files."
    )
    assert [c["id"] for c in assistant["tool_calls"]] == [
        "toolu_01A09q90qw90lq917835lq9",
        "toolu_01VkzYDXQ6gfZ1GCzn5D9gx4",
    ]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "command": "ls",
        "description": "List files in the repo",
    }
    # tool results come first, as tool messages; the rest of the user turn follows
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "toolu_01A09q90qw90lq917835lq9",
        "content": "Makefile\nREADME.md\nsrc\n",
    }
    assert messages[4] == {
        "role": "tool",
        "tool_call_id": "toolu_01VkzYDXQ6gfZ1GCzn5D9gx4",
        "content": "Read image (1.2KB)",
    }
    assert messages[5]["role"] == "user"
    assert messages[5]["content"] == [
        {"type": "image_url", "image_url": {"url": "https://example.com/repo/docs/logo.png"}},
        {"type": "text", "text": "Now show me the Makefile.", **mark},
    ]
    assert messages[6]["tool_calls"][0]["id"] == "toolu_01CmxHcbDQ7wBtWvUmHfQHSe"
    assert messages[7] == {
        "role": "tool",
        "tool_call_id": "toolu_01CmxHcbDQ7wBtWvUmHfQHSe",
        "content": "Error: cat: Makefil: No such file or directory",
    }
    assert len(messages) == 8


def test_to_chat_request_maps_parameters_marks_claudes_own_and_carries_thinking() -> None:
    chat = to_chat_request(load_wire("anthropic_request_claude_code.json"))

    assert chat["model"] == "claude-sonnet-4-5"
    assert chat["max_tokens"] == 32000
    assert chat["stop"] == ["\n\nHuman:"]
    assert chat["temperature"] == 1
    assert chat["user"] == "user_5f3e9a_account_0b7c_session_4f1d"
    assert chat["tool_choice"] == "auto"
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert "top_k" not in chat  # chat has none: only a Claude route reads the marker
    assert chat["_claude_native"] == {
        "top_k": 40,
        "tool_errors": ["toolu_01CmxHcbDQ7wBtWvUmHfQHSe"],
    }
    # Dropped before: Claude never thought, and Anthropic refused the history's tool_use
    # turn for the thinking block it lacked.
    assert chat["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert chat["messages"][2]["thinking_blocks"] == [
        {
            "type": "thinking",
            "thinking": "The user wants a description and a listing.",
            "signature": "EqQBCkgIBxABGAIqQL0jNBfUAm9ZpyvPM4hwmzsgGsdsYhgZ3",
        }
    ]
    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Executes a given bash command in a persistent shell session.",
            "parameters": load_wire("anthropic_request_claude_code.json")["tools"][0][
                "input_schema"
            ],
        },
    }


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "Bash"},
            {"type": "function", "function": {"name": "Bash"}},
            None,
        ),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ],
)
def test_to_chat_request_maps_tool_choice(choice: JSON, expected: Any, parallel: Any) -> None:
    body = _minimal(
        tools=[{"name": "Bash", "input_schema": {"type": "object"}}], tool_choice=choice
    )

    chat = to_chat_request(body)

    assert chat["tool_choice"] == expected
    assert chat.get("parallel_tool_calls") == parallel


def _minimal(**extra: Any) -> JSON:
    body: JSON = {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(extra)
    return body


def test_to_chat_request_keeps_thinking_and_redacted_blocks_in_order() -> None:
    blocks = [
        {"type": "redacted_thinking", "data": "EmwKAhgB"},
        {"type": "thinking", "thinking": "Then...", "signature": "EqQB"},
        {"type": "thinking", "thinking": "Old reasoning"},  # absent is empty, as before
    ]
    turn = {"role": "assistant", "content": [*blocks, {"type": "text", "text": "Done."}]}
    body = _minimal(thinking={"type": "adaptive", "display": "omitted"})
    body["messages"] += [turn, {"role": "user", "content": "ok"}]

    chat = to_chat_request(body)

    assert chat["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "Done.",
        "thinking_blocks": [*blocks[:2], {**blocks[2], "signature": ""}],
    }


def test_to_chat_request_with_plain_strings_keeps_them_as_strings() -> None:
    chat = to_chat_request(_minimal(system="Be terse.", stream=False))

    assert chat == {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
        "_claude_native": {},  # what only a Claude route reads: here nothing but stop_reason
    }


def test_to_chat_request_joins_system_blocks_into_one_prompt() -> None:
    system = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    chat = to_chat_request(_minimal(system=system))

    assert chat["messages"] == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "hi"},
    ]


def test_to_chat_request_skips_an_empty_system_prompt() -> None:
    chat = to_chat_request(_minimal(system=""))

    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_to_chat_request_maps_structured_output_to_strict_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = to_chat_request(
        _minimal(output_config={"format": {"type": "json_schema", "schema": schema}})
    )

    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (_minimal(max_tokens=0), "max_tokens"),
        (_minimal(model=None), "model"),
        (_minimal(messages=[]), "messages"),
        (_minimal(messages="hi"), "messages"),
        (_minimal(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
        # The Messages API takes a system prompt only in the top-level ``system``.
        (_minimal(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
        (_minimal(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (_minimal(messages=[{"role": "user", "content": []}]), "messages[0].content"),
        (
            _minimal(messages=[{"role": "user", "content": [{"type": "search_result"}]}]),
            "messages[0].content[0].type",
        ),
        (
            _minimal(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "messages[0].content[0].source.type",
        ),
        (
            _minimal(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
                        ],
                    }
                ]
            ),
            "messages[0].content[0].source.type",
        ),
        (
            _minimal(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content[0].text",
        ),
        (
            _minimal(
                messages=[
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": "x"}],
                    }
                ]
            ),
            "messages[0].content[0].input",
        ),
        (_minimal(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (
            _minimal(tools=[{"name": "t", "input_schema": {}}], tool_choice={"type": "sometimes"}),
            "tool_choice.type",
        ),
        (_minimal(stop_sequences=[1]), "stop_sequences"),
        (_minimal(temperature="hot"), "temperature"),
        (_minimal(top_k=1.5), "top_k"),
        (_minimal(metadata="me"), "metadata"),
        (_minimal(system=5), "system"),
        (_minimal(tool_choice="auto"), "tool_choice"),
        (_minimal(thinking=True), "thinking"),
        (_minimal(thinking={"budget_tokens": 1024}), "thinking.type"),
        (
            _minimal(
                messages=[{"role": "assistant", "content": [{"type": "thinking", "signature": 5}]}]
            ),
            "messages[0].content[0].signature",
        ),
        (
            _minimal(
                messages=[
                    {"role": "assistant", "content": [{"type": "redacted_thinking", "data": {}}]}
                ]
            ),
            "messages[0].content[0].data",
        ),
        (_minimal(container="container_1"), "container"),
        (_minimal(stream="yes"), "stream"),
    ],
)
def test_to_chat_request_with_invalid_input_names_the_param(body: JSON, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        to_chat_request(body)

    assert caught.value.param == param
    assert param.split("[")[0] in caught.value.message


# --- answers --------------------------------------------------------------------------------


def test_from_chat_response_with_recorded_tool_calls_is_a_valid_message() -> None:
    out = from_chat_response(load_wire("chat_completion_tool_calls.json"), model="claude-x")

    msg = Message.model_validate(out)
    assert msg.model == "claude-x"
    assert msg.id.startswith("msg_")
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    tool = msg.content[1]
    assert tool.type == "tool_use"
    assert (tool.id, tool.name, tool.input) == (
        "call_abc123",
        "get_current_weather",
        {"location": "Boston, MA"},
    )
    assert msg.usage.input_tokens == 2082 - 1920
    assert msg.usage.cache_read_input_tokens == 1920
    assert msg.usage.output_tokens == 17


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {}, "end_turn", None),
        (None, {}, "end_turn", None),
        ("length", {}, "max_tokens", None),
        ("tool_calls", {}, "tool_use", None),
        ("function_call", {}, "tool_use", None),
        ("content_filter", {}, "refusal", None),
        ("stop", {"stop_reason": "\n\nHuman:"}, "stop_sequence", "\n\nHuman:"),
        ("stop", {"stop_reason": 128001}, "end_turn", None),
    ],
)
def test_from_chat_response_maps_finish_reason(
    finish: str | None, extra: JSON, reason: str, sequence: str | None
) -> None:
    out = from_chat_response(_completion({"content": "hi"}, finish, **extra), model="m")

    msg = Message.model_validate(out)
    assert (msg.stop_reason, msg.stop_sequence) == (reason, sequence)


def test_from_chat_response_with_tool_calls_finished_by_stop_reports_tool_use() -> None:
    chat = _completion(
        {
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        },
        "stop",
    )

    msg = Message.model_validate(from_chat_response(chat, model="m"))

    assert msg.stop_reason == "tool_use"
    assert msg.content[0].type == "tool_use" and msg.content[0].input == {}


def test_from_chat_response_counts_cache_reads_and_writes_apart() -> None:
    chat = _completion({"content": "hi"}, "stop")
    chat["usage"] = {
        "prompt_tokens": 1000,
        "completion_tokens": 7,
        "total_tokens": 1007,
        "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 300},
    }

    usage = Message.model_validate(from_chat_response(chat, model="m")).usage

    assert (
        usage.input_tokens,
        usage.cache_read_input_tokens,
        usage.cache_creation_input_tokens,
        usage.output_tokens,
    ) == (100, 600, 300, 7)


def test_from_chat_response_with_refusal_reports_refusal_text() -> None:
    out = from_chat_response(
        _completion({"content": None, "refusal": "I can't help."}, "stop"), model="m"
    )

    msg = Message.model_validate(out)
    assert msg.stop_reason == "refusal"
    assert msg.content[0].type == "text" and msg.content[0].text == "I can't help."


def test_from_chat_response_with_broken_tool_arguments_raises_bad_response() -> None:
    chat = _completion(
        {
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": '}}
            ]
        },
        "tool_calls",
    )

    with pytest.raises(UpstreamBadResponseError):
        from_chat_response(chat, model="m")


def test_from_chat_response_with_arguments_cut_by_length_gives_empty_input() -> None:
    chat = _completion(
        {
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": '}}
            ]
        },
        "length",
    )

    msg = Message.model_validate(from_chat_response(chat, model="m"))

    assert msg.stop_reason == "max_tokens"
    assert msg.content[0].type == "tool_use" and msg.content[0].input == {}


def test_from_chat_response_without_choices_raises_bad_response() -> None:
    with pytest.raises(UpstreamBadResponseError):
        from_chat_response({"id": "x", "choices": []}, model="m")


# --- streams --------------------------------------------------------------------------------


def _run(stream: ChatToMessagesStream, chunks: list[JSON]) -> bytes:
    frames: list[bytes] = []
    for chunk in chunks:
        frames += stream.feed(chunk)
    return b"".join(frames)


def test_stream_of_recorded_chunks_is_valid_and_accumulates_in_the_sdk() -> None:
    stream = ChatToMessagesStream("claude-x")
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse")) + b"".join(stream.finish())

    frames = sse_frames(raw)
    for event, data in frames:
        assert data["type"] == event
        if event != "ping":  # the SDK skips pings before parsing
            _STREAM_EVENT.validate_python(data)
    names = [e for e, _ in frames]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    with _sdk_client(raw).messages.stream(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        message = s.get_final_message()
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[0].type == "text"
    assert message.content[0].text == "Checking both cities."
    calls = [(b.id, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == [
        ("call_DdmO9pD3xa9XTPNJ32zg2hcA", {"location": "Paris"}),
        ("call_f3Ok4lj3cNXWc1qN2jWbZGxL", {"location": "Bogotá"}),
    ]
    assert message.stop_reason == "tool_use"
    assert (
        message.usage.input_tokens,
        message.usage.cache_read_input_tokens,
        message.usage.output_tokens,
    ) == (182 - 128, 128, 64)


def test_stream_sends_argument_fragments_in_order_on_one_block_per_call() -> None:
    stream = ChatToMessagesStream("m")
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse"))

    deltas = [
        (d["index"], d["delta"]["partial_json"])
        for e, d in sse_frames(raw)
        if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert deltas == [(1, '{"lo'), (1, 'cation": "Paris"}'), (2, '{"location":'), (2, ' "Bogotá"}')]


def test_stream_with_text_after_a_tool_call_opens_a_new_text_block() -> None:
    stream = ChatToMessagesStream("m")
    raw = _run(
        stream,
        [
            _chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
                    ]
                }
            ),
            _chunk({"content": "done"}),
            _chunk(finish="stop"),
        ],
    ) + b"".join(stream.finish())

    starts = [
        (d["index"], d["content_block"]["type"])
        for e, d in sse_frames(raw)
        if e == "content_block_start"
    ]
    assert starts == [(0, "tool_use"), (1, "text")]
    stops = [d["index"] for e, d in sse_frames(raw) if e == "content_block_stop"]
    assert stops == [0, 1]


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {}, "end_turn", None),
        ("length", {}, "max_tokens", None),
        ("content_filter", {}, "refusal", None),
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
    ],
)
def test_stream_maps_finish_reason(
    finish: str, extra: JSON, reason: str, sequence: str | None
) -> None:
    stream = ChatToMessagesStream("m")
    raw = _run(stream, [_chunk({"content": "hi"}), _chunk(finish=finish, **extra)])
    raw += b"".join(stream.finish())

    delta = next(d for e, d in sse_frames(raw) if e == "message_delta")
    assert (delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]) == (reason, sequence)


def test_stream_cut_mid_answer_ends_with_error_event_and_no_message_stop() -> None:
    stream = ChatToMessagesStream("m")
    raw = _run(stream, chat_chunks("chat_stream_tool_calls.sse")[:5])
    raw += b"".join(stream.error("upstream connection reset", "overloaded_error"))

    frames = sse_frames(raw)
    assert frames[-1] == (
        "error",
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "upstream connection reset"},
        },
    )
    ErrorResponse.model_validate(frames[-1][1])
    assert "message_stop" not in [e for e, _ in frames]
    assert stream.finish() == [] and stream.feed(_chunk({"content": "x"})) == []
    client = _sdk_client(raw)
    with (
        pytest.raises(anthropic.APIStatusError, match="upstream connection reset"),
        client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as s,
    ):
        s.get_final_message()


def test_stream_error_with_unknown_type_is_sent_as_api_error() -> None:
    frames = sse_frames(b"".join(ChatToMessagesStream("m").error("boom", "upstream_error")))

    assert frames == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})
    ]


def test_stream_finished_without_chunks_is_still_a_complete_message() -> None:
    raw = b"".join(ChatToMessagesStream("m").finish())

    with _sdk_client(raw).messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        message = s.get_final_message()
    assert message.content == [] and message.stop_reason == "end_turn"


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_body_picks_the_type_by_status(status: int, kind: str) -> None:
    body = error_body(status, "nope")

    assert body == {"type": "error", "error": {"type": kind, "message": "nope"}}
    ErrorResponse.model_validate(body)


def test_error_body_for_413_uses_documented_request_too_large() -> None:
    # Anthropic documents 413 as request_too_large; SDK 2.x's ErrorObject union omits it.
    assert error_body(413, "too big")["error"]["type"] == "request_too_large"


# --- Claude's thinking ---------------------------------------------------------------------

SIGNED = {"type": "thinking", "thinking": "Paris: call get_weather.", "signature": "EqQBCgIYAh"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3"}


def test_from_chat_response_renders_claudes_thinking_blocks_with_their_signatures() -> None:
    # Before: one thinking block of the reasoning text, its signature empty, the redacted
    # block lost; Claude refused it when the client sent it back.
    message = {
        "content": "Sunny.",
        "reasoning_content": SIGNED["thinking"],
        "thinking_blocks": [SIGNED, REDACTED, {"type": "unknown"}],
    }

    out = from_chat_response(_completion(message, "stop"), model="claude-x")

    Message.model_validate(out)
    assert out["content"] == [SIGNED, REDACTED, {"type": "text", "text": "Sunny."}]


def _signed_stream() -> list[JSON]:
    return [
        _chunk({"role": "assistant", "reasoning_content": "Paris: "}),
        _chunk({"reasoning_content": "call get_weather."}),
        _chunk({"thinking_blocks": [SIGNED]}),
        _chunk({"thinking_blocks": [REDACTED]}),
        _chunk({"content": "Sunny."}),
        _chunk({}, "stop"),
    ]


def test_stream_sends_claudes_signature_and_redacted_blocks_as_the_sdk_accumulates_them() -> None:
    stream = ChatToMessagesStream("claude-x")
    raw = _run(stream, _signed_stream()) + b"".join(stream.finish())

    frames = sse_frames(raw)
    for event, data in frames:
        if event != "ping":
            _STREAM_EVENT.validate_python(data)
    deltas = [d["delta"] for e, d in frames if e == "content_block_delta"]
    assert deltas[:3] == [
        {"type": "thinking_delta", "thinking": "Paris: "},
        {"type": "thinking_delta", "thinking": "call get_weather."},
        {"type": "signature_delta", "signature": SIGNED["signature"]},
    ]
    with _sdk_client(raw).messages.stream(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        message = s.get_final_message()
    plain = {"content": "Sunny.", "thinking_blocks": [SIGNED, REDACTED]}
    expected = from_chat_response(_completion(plain, "stop"), model="claude-x")["content"]
    assert [b.model_dump(exclude_none=True) for b in message.content] == expected


def test_stream_with_a_thinking_block_only_given_whole_sends_its_text_then_signature() -> None:
    # Claude's display "omitted" thinking, or an upstream that sends blocks whole.
    stream = ChatToMessagesStream("claude-x")
    raw = _run(stream, [_chunk({"thinking_blocks": [SIGNED]}), _chunk({}, "stop")])

    deltas = [d["delta"] for e, d in sse_frames(raw) if e == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": SIGNED["thinking"]},
        {"type": "signature_delta", "signature": SIGNED["signature"]},
    ]
