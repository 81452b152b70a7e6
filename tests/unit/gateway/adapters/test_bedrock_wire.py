"""Canonical chat <-> Converse: requests, answers and ConverseStream events (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.adapters.bedrock_stream import ConverseToChatStream
from gateway.adapters.bedrock_wire import from_converse_response, to_converse_request
from schemas import InvalidRequestError, UpstreamBadResponseError

PNG = "iVBORw0KGgo="
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_request_carries_system_blocks_images_tool_turns_and_inference_config() -> None:
    chat: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "t2", "type": "function", "function": {"name": "g", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "one"},
            {"role": "tool", "tool_call_id": "t2", "content": "two"},
        ],
        "max_completion_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
    }

    req = to_converse_request(chat)

    assert req["system"] == [{"text": "Be brief."}]
    assert req["inferenceConfig"] == {
        "maxTokens": 50,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    user, assistant, results = req["messages"]
    assert user["content"][1] == {"image": {"format": "png", "source": {"bytes": PNG}}}
    assert [b["toolUse"]["toolUseId"] for b in assistant["content"]] == ["t1", "t2"]
    # Both results of one assistant turn travel in one user message.
    assert results["role"] == "user"
    assert [b["toolResult"]["content"] for b in results["content"]] == [
        [{"text": "one"}],
        [{"text": "two"}],
    ]


@pytest.mark.parametrize(
    ("choice", "converse"),
    [
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        ({"type": "function", "function": {"name": "f"}}, {"tool": {"name": "f"}}),
    ],
)
def test_tool_choice_maps_to_converse_tool_choice(choice: Any, converse: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    chat = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": choice}

    config = to_converse_request(chat)["toolConfig"]

    assert config["tools"] == [{"toolSpec": {"name": "f", "inputSchema": {"json": SCHEMA}}}]
    assert config["toolChoice"] == converse


def test_json_schema_response_format_is_converse_output_config() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA}}
    chat = {"messages": [{"role": "user", "content": "x"}], "response_format": fmt}

    text_format = to_converse_request(chat)["outputConfig"]["textFormat"]

    assert text_format["type"] == "json_schema"
    definition = text_format["structure"]["jsonSchema"]
    assert (definition["name"], json.loads(definition["schema"])) == ("out", SCHEMA)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("n", 2),
        ("logprobs", True),
        (
            "messages",
            [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]}],
        ),
    ],
)
def test_what_converse_cannot_honour_is_refused_naming_the_field(field: str, value: Any) -> None:
    chat = {"messages": [{"role": "user", "content": "x"}], field: value}

    with pytest.raises(InvalidRequestError) as err:
        to_converse_request(chat)

    assert err.value.param is not None and err.value.param.startswith(field)


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
    ],
)
def test_answer_stop_reason_becomes_the_chat_finish_reason(stop: str, finish: str) -> None:
    data = {
        "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "stopReason": stop,
        "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
    }

    assert from_converse_response(data, model="m")["choices"][0]["finish_reason"] == finish


def test_guardrail_answer_is_a_refusal_with_the_guardrails_text() -> None:
    data = {
        "output": {"message": {"role": "assistant", "content": [{"text": "Blocked."}]}},
        "stopReason": "guardrail_intervened",
        "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
    }

    message = from_converse_response(data, model="m")["choices"][0]["message"]

    assert (message["content"], message["refusal"]) == (None, "Blocked.")


def test_answer_usage_counts_cache_reads_and_writes_in_the_prompt() -> None:
    usage = {
        "inputTokens": 3,
        "outputTokens": 5,
        "totalTokens": 20,
        "cacheReadInputTokens": 8,
        "cacheWriteInputTokens": 4,
    }
    data = {
        "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "stopReason": "end_turn",
        "usage": usage,
    }

    got = from_converse_response(data, model="m")["usage"]

    assert (got["prompt_tokens"], got["completion_tokens"], got["total_tokens"]) == (15, 5, 20)
    assert got["prompt_tokens_details"] == {"cached_tokens": 8, "cache_write_tokens": 4}


def test_stream_tool_use_becomes_tool_call_deltas_then_finish_and_usage() -> None:
    t = ConverseToChatStream("m", include_usage=True)
    events: list[tuple[str, dict[str, Any]]] = [
        ("messageStart", {"role": "assistant"}),
        (
            "contentBlockStart",
            {"start": {"toolUse": {"toolUseId": "t1", "name": "f"}}, "contentBlockIndex": 0},
        ),
        ("contentBlockDelta", {"delta": {"toolUse": {"input": '{"a":'}}, "contentBlockIndex": 0}),
        ("contentBlockDelta", {"delta": {"toolUse": {"input": "1}"}}, "contentBlockIndex": 0}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "tool_use"}),
    ]
    chunks = [c for name, payload in events for c in t.feed(name, payload)]
    assert not t.is_complete  # usage (metadata) still to come
    usage = {"inputTokens": 2, "outputTokens": 3, "totalTokens": 5}
    chunks += t.feed("metadata", {"usage": usage, "metrics": {"latencyMs": 1}})

    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[:3]]
    assert (calls[0]["id"], calls[0]["function"]["name"]) == ("t1", "f")
    assert "".join(c["function"]["arguments"] for c in calls) == '{"a":1}'
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[4]["usage"]["total_tokens"] == 5
    assert t.is_complete


@pytest.mark.parametrize("deltas", [[], [""]], ids=["no delta", "empty delta"])
def test_a_streamed_tool_use_without_input_gets_arguments_of_an_empty_object(
    deltas: list[str],
) -> None:
    # As Claude's whole answer gives it: "" is not JSON, and a client parsing it failed.
    t = ConverseToChatStream("m", include_usage=False)
    start = {"start": {"toolUse": {"toolUseId": "t1", "name": "now"}}, "contentBlockIndex": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("contentBlockStart", start),
        *[
            ("contentBlockDelta", {"delta": {"toolUse": {"input": d}}, "contentBlockIndex": 1})
            for d in deltas
        ],
        ("contentBlockStop", {"contentBlockIndex": 1}),
        ("messageStop", {"stopReason": "tool_use"}),
    ]
    chunks = [c for name, payload in events for c in t.feed(name, payload)]

    calls = [c["choices"][0]["delta"].get("tool_calls", [{}])[0] for c in chunks]
    assert "".join(c.get("function", {}).get("arguments", "") for c in calls) == "{}"
    assert {c.get("index") for c in calls if c} == {0}


def test_stream_ending_after_message_stop_without_metadata_still_finishes() -> None:
    t = ConverseToChatStream("m", include_usage=False)
    t.feed("contentBlockDelta", {"delta": {"text": "hi"}, "contentBlockIndex": 0})

    assert t.finish() == []  # before messageStop: nothing says the answer is whole
    t.feed("messageStop", {"stopReason": "max_tokens"})
    (last,) = t.finish()

    assert last["choices"][0]["finish_reason"] == "length" and t.is_complete


@pytest.mark.parametrize("stop", ["malformed_tool_use", "malformed_model_output"])
def test_a_stop_saying_the_answer_broke_is_an_unusable_answer_never_the_routes(
    stop: str,
) -> None:
    # Both were read as "stop": a cut text, or one whose tool call was lost, went to the
    # client as a whole answer.
    data = {"output": {"message": {"role": "assistant", "content": [{"text": "Let me"}]}}}
    t = ConverseToChatStream("m", include_usage=False)
    t.feed("contentBlockDelta", {"delta": {"text": "Let me"}, "contentBlockIndex": 0})

    with pytest.raises(UpstreamBadResponseError, match=stop) as whole:
        from_converse_response({**data, "stopReason": stop}, model="m")
    with pytest.raises(UpstreamBadResponseError, match=stop) as streamed:
        t.feed("messageStop", {"stopReason": stop})

    for caught in (whole, streamed):
        assert caught.value.kind == "bad_response" and caught.value.status is None
        assert not caught.value.counts_against_endpoint
    assert not t.is_complete and t.finish() == []


def test_a_broken_answer_carries_the_usage_bedrock_billed_for_it() -> None:
    # Its usage was dropped with it: the attempt the gateway failed over from cost $0.
    usage = {"inputTokens": 30, "outputTokens": 12, "cacheReadInputTokens": 5}
    data = _converse([{"text": "Let me"}], "malformed_tool_use", usage=usage)

    with pytest.raises(UpstreamBadResponseError) as caught:
        from_converse_response(data, model="m")
    with pytest.raises(UpstreamBadResponseError) as unknown:
        from_converse_response(_converse([{"text": "Let me"}], "malformed_tool_use"), model="m")

    got = caught.value.usage
    assert got is not None and (got["prompt_tokens"], got["completion_tokens"]) == (35, 12)
    assert unknown.value.usage is None  # none reported: the attempt's usage stays unknown


# -- answers and events that break the service model's shapes -------------------------------
# Each raised AttributeError or TypeError in the translation (a 500 with a logged traceback,
# or a torn stream), or was silently dropped or relayed as nonsense (a block that was not an
# object skipped, a tool name of None, a stopReason of 5 read as end_turn).


def _converse(content: Any, stop: Any = "end_turn", **extra: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"output": {"message": message}, "stopReason": stop, **extra}


_USE = {"toolUseId": "t1", "name": "f", "input": {"a": 1}}
BAD_ANSWERS: dict[str, dict[str, Any]] = {
    "content str": _converse("hi"),
    "content object": _converse({"text": "hi"}),
    "content null": _converse(None),
    "block str": _converse(["hi", {"text": "a"}]),
    "text int": _converse([{"text": 5}]),
    "toolUse str": _converse([{"toolUse": "f"}]),
    "toolUse name null": _converse([{"toolUse": {**_USE, "name": None}}]),
    "toolUse id int": _converse([{"toolUse": {**_USE, "toolUseId": 1}}]),
    "toolUse input str": _converse([{"toolUse": {**_USE, "input": "a"}}]),
    "reasoning str": _converse([{"reasoningContent": "hmm"}]),
    "reasoningText str": _converse([{"reasoningContent": {"reasoningText": "hmm"}}]),
    "reasoning text int": _converse([{"reasoningContent": {"reasoningText": {"text": 1}}}]),
    "stopReason list": _converse([{"text": "a"}], ["end_turn"]),
}


@pytest.mark.parametrize("data", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
def test_an_answer_that_breaks_the_service_model_is_a_bad_response(data: dict[str, Any]) -> None:
    with pytest.raises(UpstreamBadResponseError) as caught:
        from_converse_response(data, model="m")

    assert caught.value.kind == "bad_response"


@pytest.mark.parametrize("usage", ["str", [1], {"inputTokens": "a"}, {"outputTokens": -1}])
def test_answer_usage_that_is_not_sane_leaves_the_usage_unknown(usage: Any) -> None:
    answer = from_converse_response(_converse([{"text": "fine"}], usage=usage), model="m")

    assert answer["usage"] is None
    assert answer["choices"][0]["message"]["content"] == "fine"


def test_answer_blocks_without_chat_text_are_skipped_a_redacted_one_kept_whole() -> None:
    content = [
        {"reasoningContent": {"redactedContent": "AAAA"}},
        {"image": {"format": "png", "source": {"bytes": PNG}}},
        {"text": "fine"},
    ]

    message = from_converse_response(_converse(content, None), model="m")["choices"][0]

    assert message["message"]["content"] == "fine" and "reasoning_content" not in message["message"]
    assert message["message"]["thinking_blocks"] == [{"type": "redacted_thinking", "data": "AAAA"}]
    assert message["finish_reason"] == "stop"


_OPENING = ("contentBlockDelta", {"delta": {"text": "Hel"}, "contentBlockIndex": 0})
BAD_EVENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "delta str": ("contentBlockDelta", {"delta": "Hel", "contentBlockIndex": 0}),
    "text int": ("contentBlockDelta", {"delta": {"text": 5}, "contentBlockIndex": 0}),
    "index str": (
        "contentBlockDelta",
        {"delta": {"toolUse": {"input": "{"}}, "contentBlockIndex": "0"},
    ),
    "toolUse delta str": ("contentBlockDelta", {"delta": {"toolUse": "{}"}}),
    "tool input object": ("contentBlockDelta", {"delta": {"toolUse": {"input": {"a": 1}}}}),
    "reasoning str": ("contentBlockDelta", {"delta": {"reasoningContent": "hmm"}}),
    "reasoning text int": ("contentBlockDelta", {"delta": {"reasoningContent": {"text": 1}}}),
    "start str": ("contentBlockStart", {"start": "toolUse", "contentBlockIndex": 1}),
    "start toolUse str": ("contentBlockStart", {"start": {"toolUse": "f"}}),
    "start name int": ("contentBlockStart", {"start": {"toolUse": {"toolUseId": "t", "name": 5}}}),
    "start index list": (
        "contentBlockStart",
        {"start": {"toolUse": {"toolUseId": "t", "name": "f"}}, "contentBlockIndex": [1]},
    ),
    "stopReason int": ("messageStop", {"stopReason": 5}),
}


@pytest.mark.parametrize(("event", "payload"), BAD_EVENTS.values(), ids=BAD_EVENTS.keys())
def test_a_stream_event_that_breaks_the_service_model_is_a_bad_response(
    event: str, payload: dict[str, Any]
) -> None:
    t = ConverseToChatStream("m", include_usage=True)
    before = t.feed(*_OPENING)

    with pytest.raises(UpstreamBadResponseError):
        t.feed(event, payload)

    assert before[0]["choices"][0]["delta"]["content"] == "Hel" and not t.is_complete


def test_stream_usage_that_is_not_sane_leaves_the_usage_unknown() -> None:
    t = ConverseToChatStream("m", include_usage=True)
    t.feed("messageStop", {"stopReason": None})

    finish, usage = t.feed("metadata", {"usage": "lots"})

    assert finish["choices"][0]["finish_reason"] == "stop" and usage["usage"] is None
