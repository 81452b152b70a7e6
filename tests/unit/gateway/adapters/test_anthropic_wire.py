"""gateway.adapters.anthropic_wire: canonical chat <-> the native Anthropic Messages wire.

Requests are checked against the ``anthropic`` SDK's request types, answers and chunks
against the ``openai`` SDK's models. Round trips through the Anthropic client surface show
that ids, tool calls and stop reasons survive Anthropic client -> gateway -> Anthropic.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import anthropic.types
import httpx2
import openai
import pydantic
import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.adapters.anthropic_wire import (
    DEFAULT_MAX_TOKENS,
    MessagesToChatStream,
    UpstreamStreamError,
    from_messages_response,
    to_messages_request,
)
from gateway.formats import anthropic_messages
from gateway.formats.openai_chat import validate_chat_request
from schemas import InvalidRequestError, UpstreamBadResponseError
from tests.fixtures.anthropic_sdk import accumulated_message
from tests.fixtures.wire_files import WIRE, drain, load_wire

JSON = dict[str, Any]
_MESSAGES_REQUEST = pydantic.TypeAdapter(MessageCreateParamsStreaming)


def _events(name: str) -> list[tuple[str, JSON]]:
    out = []
    for frame in (WIRE / name).read_text().split("\n\n"):
        lines = frame.strip().splitlines()
        if lines:
            out.append(
                (lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: ")))
            )
    return out


def _chat(**extra: Any) -> JSON:
    body: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(extra)
    return body


def _tool(name: str) -> JSON:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


# --- requests -------------------------------------------------------------------------------


def test_to_messages_request_with_recorded_chat_body_is_a_valid_messages_request() -> None:
    req = to_messages_request(
        load_wire("chat_request_multiturn.json"), upstream_model="claude-sonnet-4-5-20250929"
    )

    drain(_MESSAGES_REQUEST.validate_python(req))
    assert req["model"] == "claude-sonnet-4-5-20250929"
    assert req["system"] == [
        {"type": "text", "text": "You are a helpful assistant."},
        {"type": "text", "text": "Answer briefly."},
    ]
    assert [m["role"] for m in req["messages"]] == ["user", "assistant", "user"]
    user = req["messages"][0]["content"]
    assert user[1] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/jpeg",
            "data": "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAP",
        },
    }
    assert user[2] == {
        "type": "image",
        "source": {
            "type": "url",
            "url": (
                "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"
            ),
        },
    }
    assistant = req["messages"][1]["content"]
    assert assistant == [
        {"type": "text", "text": "An ant on a leaf. Let me check the weather too."},
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "get_weather",
            "input": {"location": "Paris"},
        },
        {
            "type": "tool_use",
            "id": "toolu_02",
            "name": "get_weather",
            "input": {"location": "Rome"},
        },
    ]
    # both tool results and the two following user messages share one user turn, results first
    assert req["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, cloudy"},
        {"type": "tool_result", "tool_use_id": "toolu_02", "content": "24C, sunny"},
        {"type": "text", "text": "Thanks. Which is warmer?"},
        {"type": "text", "text": "Answer in one word."},
    ]


def test_to_messages_request_maps_parameters() -> None:
    req = to_messages_request(load_wire("chat_request_multiturn.json"), upstream_model="c")

    assert req["max_tokens"] == 1024
    assert req["stop_sequences"] == ["\n\nEND"]
    assert (req["temperature"], req["top_p"]) == (0.2, 0.9)
    assert req["metadata"] == {"user_id": "user-1234"}
    assert req["stream"] is True
    assert req["tools"] == [
        {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "input_schema": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        }
    ]
    assert req["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    for dropped in ("stream_options", "seed", "presence_penalty", "n", "user"):
        assert dropped not in req


SIGNED = {"type": "thinking", "thinking": "Paris, so get_weather.", "signature": "EqQBCgIYAh"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"}


@pytest.mark.parametrize(
    "thinking",
    [
        {"type": "enabled", "budget_tokens": 2048},
        {"type": "disabled"},
        {"type": "adaptive", "display": "omitted"},
    ],
)
def test_to_messages_request_sends_the_thinking_config_as_it_is(thinking: JSON) -> None:
    # Dropped before: Claude never thought, whatever the client asked.
    req = to_messages_request(
        _chat(max_tokens=4096, thinking=thinking, stream=True), upstream_model="c"
    )

    drain(_MESSAGES_REQUEST.validate_python(req))
    assert req["thinking"] == thinking


def test_to_messages_request_sends_signed_thinking_blocks_back_first_in_their_turn() -> None:
    # Dropped before: Anthropic refuses a tool_use turn without its thinking when it is on.
    unsigned = {"type": "thinking", "thinking": "another provider's", "signature": ""}
    call = {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assistant = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [call],
        "thinking_blocks": [SIGNED | {"extra": 1}, unsigned, REDACTED, {"type": "other"}],
    }
    result = {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    chat = _chat(thinking={"type": "enabled", "budget_tokens": 1024}, stream=True)
    chat["messages"] += [assistant, result]

    req = to_messages_request(chat, upstream_model="c")

    drain(_MESSAGES_REQUEST.validate_python(req))
    assert req["messages"][1]["content"] == [
        SIGNED,
        REDACTED,
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    ]


def test_to_messages_request_without_max_tokens_uses_the_default() -> None:
    req = to_messages_request(_chat(stop="END"), upstream_model="c")

    assert req == {
        "model": "c",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "stop_sequences": ["END"],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_to_messages_request_prefers_max_completion_tokens() -> None:
    req = to_messages_request(_chat(max_tokens=10, max_completion_tokens=20), upstream_model="c")

    assert req["max_tokens"] == 20


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", False, {"type": "none"}),
        ({"type": "function", "function": {"name": "a"}}, None, {"type": "tool", "name": "a"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        (None, None, None),
    ],
)
def test_to_messages_request_maps_tool_choice(choice: Any, parallel: Any, expected: Any) -> None:
    req = to_messages_request(
        _chat(tools=[_tool("a")], tool_choice=choice, parallel_tool_calls=parallel),
        upstream_model="c",
    )

    assert req.get("tool_choice") == expected


def test_to_messages_request_with_allowed_tools_offers_only_those() -> None:
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "b"}}],
        },
    }

    req = to_messages_request(
        _chat(tools=[_tool("a"), _tool("b")], tool_choice=choice), upstream_model="c"
    )

    assert [t["name"] for t in req["tools"]] == ["b"]
    assert req["tool_choice"] == {"type": "any"}


def test_to_messages_request_without_tools_drops_tool_choice() -> None:
    assert "tool_choice" not in to_messages_request(_chat(tool_choice="none"), upstream_model="c")


def test_to_messages_request_maps_json_schema_to_structured_output() -> None:
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    req = to_messages_request(
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": schema, "strict": True},
            }
        ),
        upstream_model="c",
    )

    assert req["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


def test_to_messages_request_sends_pdf_files_as_documents() -> None:
    req = to_messages_request(
        _chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "file",
                            "file": {
                                "file_data": "data:application/pdf;base64,JVBERi0x",
                                "filename": "a.pdf",
                            },
                        }
                    ],
                }
            ]
        ),
        upstream_model="c",
    )

    assert req["messages"][0]["content"] == [
        {
            "type": "document",
            "title": "a.pdf",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
        }
    ]


def _user_part(part: JSON) -> JSON:
    return _chat(messages=[{"role": "user", "content": [part]}])


@pytest.mark.parametrize(
    ("chat", "param"),
    [
        (_chat(n=2), "n"),
        (_chat(logprobs=True), "logprobs"),
        (_chat(top_logprobs=3), "top_logprobs"),
        (_chat(logit_bias={"50256": -100}), "logit_bias"),
        (_chat(temperature=1.5), "temperature"),
        (_chat(max_tokens=0), "max_tokens"),
        (_chat(messages=[]), "messages"),
        (_chat(functions=[{"name": "f"}]), "functions"),
        (_chat(response_format={"type": "json_object"}), "response_format"),
        (_chat(tools=[{"type": "custom", "custom": {"name": "grammar"}}]), "tools[0].type"),
        (
            _chat(tools=[_tool("a")], tool_choice={"type": "custom", "custom": {"name": "a"}}),
            "tool_choice",
        ),
        (_chat(messages=[{"role": "function", "name": "f", "content": "x"}]), "messages[0].role"),
        (
            _user_part({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}),
            "messages[0].content[0].type",
        ),
        (
            _user_part({"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}),
            "messages[0].content[0].image_url.url",
        ),
        (
            _user_part({"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}),
            "messages[0].content[0].image_url.url",
        ),
        (
            _user_part({"type": "file", "file": {"file_id": "file-1"}}),
            "messages[0].content[0].file.file_data",
        ),
        (
            _chat(
                messages=[
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "t",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[1]"},
                            }
                        ],
                    }
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (_chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    ],
)
def test_to_messages_request_refuses_what_it_cannot_honour(chat: JSON, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        to_messages_request(chat, upstream_model="c")

    assert caught.value.param == param


# --- answers --------------------------------------------------------------------------------


def test_from_messages_response_with_recorded_tool_use_is_a_valid_chat_completion() -> None:
    out = from_messages_response(load_wire("anthropic_message_tool_use.json"), model="gw-model")

    completion = ChatCompletion.model_validate(out)
    assert (completion.id, completion.model) == ("msg_01Aq9w938a90dw8q", "gw-model")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I'll check the current weather in San Francisco."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id == "toolu_01A09q90qw90lq917835lq9"
    assert json.loads(call.function.arguments) == {
        "location": "San Francisco, CA",
        "unit": "celsius",
    }
    assert completion.usage is not None
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (472 + 2048 + 1024, 89, 472 + 2048 + 1024 + 89)
    details = completion.usage.prompt_tokens_details
    assert details is not None
    assert (details.cached_tokens, details.cache_write_tokens) == (2048, 1024)


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        (None, "stop"),
    ],
)
def test_from_messages_response_maps_stop_reason(stop: str | None, finish: str) -> None:
    msg = {
        "id": "msg_1",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": stop,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }

    completion = ChatCompletion.model_validate(from_messages_response(msg, model="m"))

    assert completion.choices[0].finish_reason == finish


MALFORMED_ANSWERS = {
    "text int": {"content": [{"type": "text", "text": 5}]},
    "text object": {"content": [{"type": "text", "text": {"a": 1}}]},
    "content not a list": {"content": "hello"},
    "block not an object": {"content": ["hello", 5, None]},
    "tool id int": {"content": [{"type": "tool_use", "id": 5, "name": "f", "input": {}}]},
    "tool input str": {"content": [{"type": "tool_use", "id": "t", "name": "f", "input": "s"}]},
    "stop_reason list": {"content": [], "stop_reason": ["x"]},
    "stop_sequence int": {"content": [], "stop_reason": "stop_sequence", "stop_sequence": 5},
    "thinking int": {"content": [{"type": "thinking", "thinking": 5, "signature": "s"}]},
    "signature list": {"content": [{"type": "thinking", "thinking": "t", "signature": [1]}]},
    "redacted data int": {"content": [{"type": "redacted_thinking", "data": 5}]},
}


@pytest.mark.parametrize("msg", MALFORMED_ANSWERS.values(), ids=MALFORMED_ANSWERS.keys())
def test_from_messages_response_breaking_the_api_shapes_raises_bad_response(msg: JSON) -> None:
    # A text of 5 once failed "".join with a TypeError (a 500); a block that was not an
    # object was skipped, its text silently lost.
    with pytest.raises(UpstreamBadResponseError, match="invalid response") as caught:
        from_messages_response(msg, model="m")

    assert caught.value.kind == "bad_response"


@pytest.mark.parametrize("usage", [[1], "lots", {"input_tokens": "a"}])
def test_from_messages_response_with_usage_not_an_object_of_counts_has_usage_unknown(
    usage: Any,
) -> None:
    msg = {"id": {"a": 1}, "content": [{"type": "text", "text": "hi"}], "usage": usage}

    completion = ChatCompletion.model_validate(from_messages_response(msg, model="m"))

    assert completion.usage is None
    assert completion.choices[0].message.content == "hi"
    assert completion.id.startswith("chatcmpl-")  # an id that is not a string is not shown


THINKING_MESSAGE = "anthropic_message_thinking.json"  # shaped as the SDK's Message (checked)
THINKING_STREAM = "anthropic_stream_thinking.sse"  # the same answer, streamed


def _thinking_blocks() -> list[JSON]:
    content = load_wire(THINKING_MESSAGE)["content"]
    return [b for b in content if b["type"] in ("thinking", "redacted_thinking")]


def test_from_messages_response_keeps_thinking_blocks_with_their_signatures() -> None:
    # Dropped before: the message held no reasoning, and the signatures were lost.
    raw = load_wire(THINKING_MESSAGE)
    anthropic.types.Message.model_validate(raw)

    out = from_messages_response(raw, model="gw")

    message = ChatCompletion.model_validate(out).choices[0].message
    thought = raw["content"][0]["thinking"]
    assert out["choices"][0]["message"]["reasoning_content"] == thought
    assert (message.model_extra or {})["thinking_blocks"] == _thinking_blocks()
    assert message.content == "Let me check the weather in Paris."
    assert message.tool_calls is not None
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_from_messages_response_with_only_redacted_thinking_has_no_reasoning_text() -> None:
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    msg = {"content": [redacted, {"type": "text", "text": "hi"}], "stop_reason": "end_turn"}

    message = from_messages_response(msg, model="m")["choices"][0]["message"]

    assert message["thinking_blocks"] == [redacted] and "reasoning_content" not in message


def test_answer_round_trip_keeps_stop_sequence_and_tool_ids() -> None:
    upstream = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "c",
        "content": [{"type": "text", "text": "1, 2, 3"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "4",
        "usage": {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 2},
    }

    back = anthropic_messages.from_chat_response(
        from_messages_response(upstream, model="c"), model="c"
    )

    assert (back["id"], back["stop_reason"], back["stop_sequence"]) == (
        "msg_1",
        "stop_sequence",
        "4",
    )
    assert back["usage"]["input_tokens"] == 5 and back["usage"]["cache_read_input_tokens"] == 2
    tooled = from_messages_response(load_wire("anthropic_message_tool_use.json"), model="c")
    again = anthropic_messages.from_chat_response(tooled, model="c")
    assert again["content"] == load_wire("anthropic_message_tool_use.json")["content"]


def test_request_round_trip_through_the_anthropic_surface_keeps_ids_and_blocks() -> None:
    original = load_wire("anthropic_request_claude_code.json")

    req = to_messages_request(
        anthropic_messages.to_chat_request(original), upstream_model="claude-sonnet-4-5"
    )

    drain(_MESSAGES_REQUEST.validate_python(req))
    sent_ids = [b["id"] for m in req["messages"] for b in m["content"] if b["type"] == "tool_use"]
    result_ids = [
        b["tool_use_id"]
        for m in req["messages"]
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert (
        sent_ids
        == result_ids
        == [
            "toolu_01A09q90qw90lq917835lq9",
            "toolu_01VkzYDXQ6gfZ1GCzn5D9gx4",
            "toolu_01CmxHcbDQ7wBtWvUmHfQHSe",
        ]
    )
    assert [m["role"] for m in req["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert req["messages"][0]["content"][2] == original["messages"][0]["content"][2]
    assert req["tool_choice"] == {"type": "auto"}


TEXT_DELTA = {"type": "text_delta", "text": "hi"}


# --- streams --------------------------------------------------------------------------------


def _feed_all(stream: MessagesToChatStream, events: list[tuple[str, JSON]]) -> list[JSON]:
    chunks = []
    for event, data in events:
        chunks += stream.feed(event, data)
    return chunks


def test_stream_of_recorded_events_gives_valid_chunks_in_order() -> None:
    stream = MessagesToChatStream("gw-model")
    chunks = _feed_all(stream, _events("anthropic_stream_tool_use.sse"))

    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    assert stream.is_complete
    assert chunks[0]["choices"][0]["delta"] == {"content": "Okay", "role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Okay, let's check the weather for San Francisco, CA:"
    calls = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert json.loads("".join(tc["function"]["arguments"] for tc in calls)) == {
        "location": "San Francisco, CA",
        "unit": "fahrenheit",
    }
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 472 + 1536,
        "completion_tokens": 89,
        "total_tokens": 472 + 1536 + 89,
        "prompt_tokens_details": {"cached_tokens": 1536, "cache_write_tokens": 0},
    }
    assert {c["id"] for c in chunks} == {"msg_014p7gG3wDgGV9EUtLvnow3U"}


def test_stream_accumulates_in_the_openai_sdk() -> None:
    chunks = _feed_all(MessagesToChatStream("gw"), _events("anthropic_stream_tool_use.sse"))
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    body += b"data: [DONE]\n\n"

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(
        api_key="t",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    with client.chat.completions.stream(
        model="gw", messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_completion()

    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Okay, let's check the weather for San Francisco, CA:"
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == (
        '{"location": "San Francisco, CA", "unit": "fahrenheit"}'
    )


def _accumulated(chunks: list[JSON]) -> JSON:
    """What a chat client accumulates of canonical chunks: texts joined, thinking blocks
    (each whole in one delta) placed by their index, tool call fragments joined by index."""
    message: JSON = {"content": "", "reasoning_content": ""}
    calls: dict[int, JSON] = {}
    blocks: dict[int, JSON] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            for key in ("content", "reasoning_content"):
                message[key] += delta.get(key) or ""
            for block in delta.get("thinking_blocks") or ():
                blocks[block["index"]] = {k: v for k, v in block.items() if k != "index"}
            for call in delta.get("tool_calls") or ():
                known = calls.setdefault(call["index"], {"arguments": ""})
                known.update({k: v for k, v in call.items() if k in ("id", "type")})
                known["name"] = call.get("function", {}).get("name") or known.get("name")
                known["arguments"] += call["function"].get("arguments") or ""
    message["tool_calls"] = list(calls.values())
    message["thinking_blocks"] = [blocks[i] for i in range(len(blocks))]  # numbered from 0
    return message


def test_stream_with_thinking_accumulates_to_the_plain_answer() -> None:
    # Dropped before: no reasoning delta, no signature; the client could not send it back.
    events = _events(THINKING_STREAM)
    for _, data in events:
        if data["type"] != "ping":  # the SDK's union has no ping
            pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent).validate_python(data)

    chunks = _feed_all(MessagesToChatStream("gw"), events)

    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    got = _accumulated(chunks)
    plain = from_messages_response(load_wire(THINKING_MESSAGE), model="gw")["choices"][0]
    assert got["reasoning_content"] == plain["message"]["reasoning_content"]
    assert got["thinking_blocks"] == plain["message"]["thinking_blocks"] == _thinking_blocks()
    assert got["content"] == plain["message"]["content"]
    (call,) = got["tool_calls"]
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    thinking = [c["choices"][0]["delta"] for c in chunks[:4]]
    assert [d.get("reasoning_content") for d in thinking[:3]] == [
        "The user asks for the weather in Paris.",
        " I should call get_weather",
        " with the city.",
    ]
    # At the block's stop, numbered as a list's entries in a chat delta are.
    assert thinking[3] == {"thinking_blocks": [{**_thinking_blocks()[0], "index": 0}]}


def test_stream_cut_before_message_stop_never_finishes() -> None:
    stream = MessagesToChatStream("m")
    chunks = _feed_all(stream, _events("anthropic_stream_tool_use.sse")[:-1])

    assert not stream.is_complete
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert all(c["choices"] for c in chunks)


def test_stream_gives_no_chunk_before_content() -> None:
    stream = MessagesToChatStream("m")

    assert _feed_all(stream, _events("anthropic_stream_tool_use.sse")[:3]) == []


@pytest.mark.parametrize(
    ("error_type", "status", "counts"),
    [
        ("overloaded_error", 529, True),
        ("api_error", 500, True),
        ("rate_limit_error", 429, True),
        ("invalid_request_error", 400, False),
        ("brand_new_error", None, True),
    ],
)
def test_stream_error_event_raises_upstream_stream_error(
    error_type: str, status: int | None, counts: bool
) -> None:
    stream = MessagesToChatStream("m")
    _feed_all(stream, _events("anthropic_stream_tool_use.sse")[:4])

    with pytest.raises(UpstreamStreamError, match="Overloaded") as caught:
        stream.feed(
            "error", {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
        )

    assert caught.value.error_type == error_type
    assert caught.value.status == status
    assert caught.value.counts_against_endpoint is counts
    assert not stream.is_complete


_TEXT_START = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
_TOOL = {"type": "tool_use", "id": "toolu_1", "name": "f"}
MALFORMED_EVENTS = {
    "message str": {"type": "message_start", "message": "str"},
    "block str": {"type": "content_block_start", "index": 0, "content_block": "str"},
    "block text int": {**_TEXT_START, "content_block": {"type": "text", "text": 5}},
    "tool index list": {"type": "content_block_start", "index": [1], "content_block": _TOOL},
    "tool name int": {"type": "content_block_start", "content_block": {**_TOOL, "name": 7}},
    "tool input str": {"type": "content_block_start", "content_block": {**_TOOL, "input": "x"}},
    "delta str": {"type": "content_block_delta", "index": 0, "delta": "str"},
    "delta text int": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": 5}},
    "json delta index list": {
        "type": "content_block_delta",
        "index": [0],
        "delta": {"type": "input_json_delta", "partial_json": "{}"},
    },
    "json delta int": {
        "type": "content_block_delta",
        "delta": {"type": "input_json_delta", "partial_json": 5},
    },
    "message_delta str": {"type": "message_delta", "delta": "x", "usage": 5},
    "thinking int": {
        "type": "content_block_delta",
        "delta": {"type": "thinking_delta", "thinking": 5},
    },
    "signature int": {
        "type": "content_block_delta",
        "delta": {"type": "signature_delta", "signature": 5},
    },
    "redacted data list": {
        "type": "content_block_start",
        "content_block": {"type": "redacted_thinking", "data": [1]},
    },
    "stop_reason int": {"type": "message_delta", "delta": {"stop_reason": 5}},
    "error str": {"type": "error", "error": "str"},
    "error list": {"type": "error", "error": [1, 2]},
    "error type object": {"type": "error", "error": {"type": {"x": 1}, "message": "m"}},
    "type int": {"type": 5, "index": 0},
}


@pytest.mark.parametrize("event", MALFORMED_EVENTS.values(), ids=MALFORMED_EVENTS.keys())
def test_stream_event_breaking_the_api_shapes_raises_bad_response(event: JSON) -> None:
    # A string where an object belongs once raised AttributeError (a 500, or a connection
    # torn mid-stream), a list as a block index TypeError.
    stream = MessagesToChatStream("m")
    stream.feed("message_start", {"type": "message_start", "message": {"id": "msg_1"}})
    stream.feed("content_block_start", _TEXT_START | {"index": 1, "content_block": _TOOL})

    with pytest.raises(UpstreamBadResponseError, match="invalid response") as caught:
        stream.feed(None, event)

    assert caught.value.kind == "bad_response"


@pytest.mark.parametrize(
    ("start_usage", "delta_usage"),
    [([1, 2], {"output_tokens": 5}), ({"input_tokens": 3}, [1]), ({"input_tokens": "x"}, None)],
    ids=["start list", "delta list", "start count str"],
)
def test_stream_usage_that_is_not_an_object_of_counts_leaves_usage_unknown(
    start_usage: Any, delta_usage: Any
) -> None:
    # Odd bookkeeping never fails an answer (the adapter seam's rule): billed on the estimate.
    stream = MessagesToChatStream("m")
    events = [
        ("message_start", {"type": "message_start", "message": {"usage": start_usage}}),
        ("content_block_delta", {"type": "content_block_delta", "delta": TEXT_DELTA}),
        ("message_delta", {"type": "message_delta", "delta": {}, "usage": delta_usage}),
        ("message_stop", {"type": "message_stop"}),
    ]

    chunks = _feed_all(stream, events)

    assert stream.is_complete and stream.usage is None
    assert chunks[0]["choices"][0]["delta"]["content"] == "hi"


def test_stream_with_stop_sequence_reports_it_like_vllm() -> None:
    stream = MessagesToChatStream("m", include_usage=False)
    chunks = _feed_all(
        stream,
        [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {"id": "msg_1", "usage": {"input_tokens": 3, "output_tokens": 1}},
                },
            ),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "1, 2, 3"},
                },
            ),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "usage": {"output_tokens": 4},
                    "delta": {"stop_reason": "stop_sequence", "stop_sequence": "4"},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ],
    )

    assert len(chunks) == 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == "4"
    usage = stream.usage
    assert usage is not None
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == 3


def test_stream_round_trip_through_the_anthropic_surface_matches_upstream() -> None:
    upstream = MessagesToChatStream("claude-x")
    client_side = anthropic_messages.ChatToMessagesStream("claude-x")
    frames: list[bytes] = []
    for event, data in _events("anthropic_stream_tool_use.sse"):
        for chunk in upstream.feed(event, data):
            frames += client_side.feed(chunk)
    frames += client_side.finish()

    events = [(f.split(b"\n")[0][7:].decode(), json.loads(f.split(b"\n")[1][6:])) for f in frames]
    blocks = [d["content_block"] for e, d in events if e == "content_block_start"]
    assert blocks == [
        {"type": "text", "text": ""},
        {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {},
        },
    ]
    delta = next(d for e, d in events if e == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert (
        delta["usage"]["input_tokens"],
        delta["usage"]["cache_read_input_tokens"],
        delta["usage"]["output_tokens"],
    ) == (472, 1536, 89)


def test_thinking_round_trip_through_the_anthropic_surface_is_claudes_answer() -> None:
    # Claude -> gateway -> Messages client: the same blocks, signatures and order, plain and
    # streamed (the stream as the anthropic SDK accumulates it).
    original = load_wire(THINKING_MESSAGE)
    plain = anthropic_messages.from_chat_response(
        from_messages_response(original, model="claude-x"), model="claude-x"
    )
    upstream = MessagesToChatStream("claude-x")
    client_side = anthropic_messages.ChatToMessagesStream("claude-x")
    frames: list[bytes] = []
    for event, data in _events(THINKING_STREAM):
        for chunk in upstream.feed(event, data):
            frames += client_side.feed(chunk)
    frames += client_side.finish()
    body = b"".join(frames)

    streamed = accumulated_message(body)

    assert plain["content"] == original["content"]
    assert [b.model_dump(exclude_none=True) for b in streamed.content] == original["content"]


@pytest.mark.parametrize(
    ("effort", "max_tokens", "thinking", "sent_max"),
    [
        ("low", None, {"type": "enabled", "budget_tokens": 1024}, DEFAULT_MAX_TOKENS + 1024),
        ("minimal", 2000, {"type": "enabled", "budget_tokens": 1024}, 2000),
        ("medium", 8000, {"type": "enabled", "budget_tokens": 2048}, 8000),
        ("high", None, {"type": "enabled", "budget_tokens": 4096}, DEFAULT_MAX_TOKENS + 4096),
        ("none", 100, {"type": "disabled"}, 100),
        ("ultra", 100, None, 100),
    ],
)
def test_to_messages_request_thinks_as_hard_as_the_reasoning_effort_asks(
    effort: str, max_tokens: int | None, thinking: JSON | None, sent_max: int
) -> None:
    # Dropped before: a chat or Responses client's reasoning_effort never made Claude think.
    chat = _chat(reasoning_effort=effort, max_tokens=max_tokens, stream=True)

    req = to_messages_request(chat, upstream_model="c")

    drain(_MESSAGES_REQUEST.validate_python(req))
    assert (req.get("thinking"), req["max_tokens"]) == (thinking, sent_max)


@pytest.mark.parametrize(
    "extra",
    [
        {"max_tokens": 4096},
        {"temperature": 0.2},
        {"top_p": 0.5},
        {"tools": [_tool("f")], "tool_choice": "required"},
    ],
)
def test_to_messages_request_sends_no_thinking_for_an_effort_claude_cannot_think_with(
    extra: JSON,
) -> None:
    # A chat dialect's hint, not Claude's own config: answered as before efforts were mapped,
    # never a refusal that a route of another provider would not give.
    req = to_messages_request(_chat(reasoning_effort="high", **extra), upstream_model="c")

    assert "thinking" not in req


def test_to_messages_request_prefers_the_thinking_config_to_the_effort() -> None:
    thinking = {"type": "enabled", "budget_tokens": 9000}

    req = to_messages_request(_chat(thinking=thinking, reasoning_effort="low"), upstream_model="c")

    assert (req["thinking"], req["max_tokens"]) == (thinking, DEFAULT_MAX_TOKENS + 9000)


# --- interleaved thinking: Claude's order survives ------------------------------------------

INTERLEAVED: list[JSON] = [
    {"type": "thinking", "thinking": "Which city?", "signature": "sig-1"},
    {"type": "text", "text": "Checking Paris."},
    {"type": "thinking", "thinking": "Call the tool.", "signature": "sig-2"},
    {"type": "redacted_thinking", "data": "opaque"},
    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
]


def _claude_events(content: list[JSON]) -> list[tuple[str, JSON]]:
    """Claude's stream of a message holding ``content``, as the API sends it."""
    start = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events: list[tuple[str, JSON]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(content):
        empty: JSON = {
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
            "text": {"type": "text", "text": ""},
            "tool_use": {**block, "input": {}},
            "redacted_thinking": block,
        }[block["type"]]
        events.append(("content_block_start", {"index": i, "content_block": empty}))
        deltas: dict[str, list[JSON]] = {
            "thinking": [
                {"type": "thinking_delta", "thinking": block.get("thinking")},
                {"type": "signature_delta", "signature": block.get("signature")},
            ],
            "text": [{"type": "text_delta", "text": block.get("text")}],
            "tool_use": [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            if block["type"] == "tool_use"
            else [],
            "redacted_thinking": [],
        }
        for delta in deltas[block["type"]]:
            events.append(("content_block_delta", {"index": i, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    stop = {"stop_reason": "tool_use", "stop_sequence": None}
    events.append(("message_delta", {"delta": stop, "usage": {"output_tokens": 9}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def test_interleaved_thinking_keeps_claudes_order_plain_streamed_and_sent_back() -> None:
    # Before: the plain answer and the history sent back put every thinking block first
    # ([thinking, thinking, redacted, text, tool_use]) while the stream kept Claude's order.
    message: JSON = {"id": "msg_1", "type": "message", "role": "assistant"}
    message["content"] = INTERLEAVED
    message |= {"stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 9}}
    canonical = from_messages_response(message, model="claude-x")
    upstream = MessagesToChatStream("claude-x")
    client_side = anthropic_messages.ChatToMessagesStream("claude-x")
    frames: list[bytes] = []
    streamed_blocks: list[JSON] = []
    for event, data in _claude_events(INTERLEAVED):
        for chunk in upstream.feed(event, data):
            for choice in chunk["choices"]:
                streamed_blocks += choice["delta"].get("thinking_blocks") or []
            frames += client_side.feed(chunk)
    frames += client_side.finish()
    events = [json.loads(f.split(b"\n")[1][6:]) for f in frames]
    streamed = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    history: JSON = {
        "model": "claude-x",
        "max_tokens": 9000,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": INTERLEAVED},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
    }

    plain = anthropic_messages.from_chat_response(canonical, model="claude-x")
    sent = to_messages_request(anthropic_messages.to_chat_request(history), upstream_model="c")

    assert plain["content"] == INTERLEAVED
    assert streamed == [block["type"] for block in INTERLEAVED]
    blocks = canonical["choices"][0]["message"]["thinking_blocks"]
    assert streamed_blocks == [{**b, "index": i} for i, b in enumerate(blocks)]
    assert sent["messages"][1]["content"] == INTERLEAVED
    resent = to_messages_request(
        _chat(
            messages=[
                history["messages"][0],
                {"role": "assistant", **canonical["choices"][0]["message"]},
            ]
        ),
        upstream_model="c",
    )
    assert resent["messages"][1]["content"] == INTERLEAVED


def test_to_messages_request_merging_two_assistant_messages_keeps_thinking_first() -> None:
    # Before: the second message's thinking went mid-turn, after the first one's text, and
    # Anthropic refuses a thinking turn that does not start with its thinking.
    signed = {"type": "thinking", "thinking": "Call the tool.", "signature": "sig-1"}
    call = {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    chat = _chat(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Checking."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call],
                "thinking_blocks": [signed],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        ]
    )

    req = to_messages_request(chat, upstream_model="c")

    assert [b["type"] for b in req["messages"][1]["content"]] == ["thinking", "text", "tool_use"]
    assert req["messages"][1]["content"][0] == signed


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 0.2}, "temperature"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 0.5}, "top_p"),
        ({"tools": [_tool("f")], "tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [_tool("f")], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
        ),
    ],
)
def test_to_messages_request_refuses_what_claude_refuses_while_thinking(
    extra: JSON, param: str
) -> None:
    # Before: sent on, for Anthropic to answer 400 ("temperature may only be set to 1 when
    # thinking is enabled") after the route was chosen, and the next route tried.
    on = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    with pytest.raises(InvalidRequestError) as caught:
        to_messages_request(_chat(**extra, **on), upstream_model="c")

    assert caught.value.param == param


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 1, "top_p": 0.95, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"tools": [_tool("f")], "tool_choice": "auto", "reasoning_effort": "low"},
        {"temperature": 0.2, "thinking": {"type": "disabled"}},
        {"temperature": 0.2, "reasoning_effort": "none"},
        {"temperature": 0.2, "top_p": 0.5, "tool_choice": "required", "tools": [_tool("f")]},
    ],
)
def test_to_messages_request_takes_sampling_claude_allows(extra: JSON) -> None:
    req = to_messages_request(_chat(**extra, stream=True), upstream_model="c")

    drain(_MESSAGES_REQUEST.validate_python(req))


def test_stream_of_consecutive_thinking_blocks_signs_each_one_as_claude_did() -> None:
    # Each signature on its own block, a redacted block between them kept whole.
    content: list[JSON] = [
        {"type": "thinking", "thinking": "First.", "signature": "sig-1"},
        {"type": "thinking", "thinking": "", "signature": "sig-2"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": "Third.", "signature": "sig-3"},
        {"type": "text", "text": "Done."},
    ]
    upstream = MessagesToChatStream("claude-x")
    client_side = anthropic_messages.ChatToMessagesStream("claude-x")
    frames: list[bytes] = []
    for event, data in _claude_events(content):
        for chunk in upstream.feed(event, data):
            frames += client_side.feed(chunk)
    frames += client_side.finish()
    body = b"".join(frames)

    streamed = accumulated_message(body)

    assert [b.model_dump(exclude_none=True) for b in streamed.content] == content


def test_a_chat_clients_thinking_blocks_with_after_are_checked_and_put_back_in_place() -> None:
    blocks = [INTERLEAVED[0], {**INTERLEAVED[2], "after": 1}]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    said = {"role": "assistant", "content": "Checking.", "tool_calls": [call]}
    body = _chat(messages=[{"role": "user", "content": "hi"}, {**said, "thinking_blocks": blocks}])

    req = to_messages_request(validate_chat_request(body), upstream_model="c")
    broken = _chat(messages=[{**said, "thinking_blocks": [{**blocks[1], "after": "1"}]}])

    kinds = [b["type"] for b in req["messages"][1]["content"]]
    assert kinds == ["thinking", "text", "thinking", "tool_use"]
    with pytest.raises(InvalidRequestError, match="after"):
        validate_chat_request(broken)


def _json_delta(index: int) -> tuple[str, JSON]:
    delta = {"type": "input_json_delta", "partial_json": '{"q": "x"}'}
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def test_stream_arguments_of_a_server_tool_block_have_no_chat_form_and_are_skipped() -> None:
    server_tool = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
    start = {"type": "content_block_start", "index": 0, "content_block": server_tool}
    stream = MessagesToChatStream("gw-model")
    stream.feed("message_start", {"type": "message_start", "message": {"id": "msg_1"}})

    chunks = _feed_all(stream, [("content_block_start", start), _json_delta(0)])

    assert [c for c in chunks if c["choices"][0]["delta"].get("tool_calls")] == []


def test_stream_arguments_for_a_block_never_started_are_a_bad_response() -> None:
    stream = MessagesToChatStream("gw-model")
    stream.feed("message_start", {"type": "message_start", "message": {"id": "msg_1"}})

    with pytest.raises(UpstreamBadResponseError, match="never started"):
        _feed_all(stream, [_json_delta(3)])
