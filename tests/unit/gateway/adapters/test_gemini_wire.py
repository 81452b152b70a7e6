"""gateway.adapters.gemini_wire: canonical chat <-> the Gemini generateContent wire, checked
against google-genai's types (what the adapter sends must validate as the request's fields;
what Gemini answers is read as its types describe it)."""

from __future__ import annotations

from typing import Any

import pytest
from google.genai import types

from gateway.adapters.gemini_wire import (
    GeminiToChatStream,
    from_gemini_response,
    to_gemini_request,
)
from schemas import InvalidRequestError, UpstreamBadResponseError

PNG = "data:image/png;base64,iVBORw0KGgo="
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CONVERSATION: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": PNG}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "developer", "content": "answer in French"},
    ],
    "tools": [WEATHER],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "max_tokens": 50,
    "temperature": 0.3,
    "top_p": 0.9,
    "stop": ["END"],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    },
}


def test_request_translates_every_part_of_a_conversation_as_the_types_describe_it() -> None:
    req = to_gemini_request(CONVERSATION)

    contents = [types.Content.model_validate(c) for c in req["contents"]]
    system = types.Content.model_validate(req["systemInstruction"])
    config = types.GenerationConfig.model_validate(req["generationConfig"])
    (tool,) = [types.Tool.model_validate(t) for t in req["tools"]]
    tool_config = types.ToolConfig.model_validate(req["toolConfig"])
    assert [c.role for c in contents] == ["user", "model", "user"]
    user, model, result = contents
    assert user.parts is not None and user.parts[1].inline_data is not None
    assert (user.parts[1].inline_data.mime_type, user.parts[0].text) == (
        "image/png",
        "what is this?",
    )
    assert model.parts is not None and model.parts[0].function_call is not None
    assert model.parts[0].function_call.args == {"city": "Paris"}
    assert result.parts is not None and result.parts[0].function_response is not None
    assert result.parts[0].function_response.name == "get_weather"
    assert result.parts[0].function_response.response == {"result": "sunny"}
    assert system.parts is not None
    assert [p.text for p in system.parts] == ["be brief", "answer in French"]
    assert tool.function_declarations is not None
    assert tool.function_declarations[0].parameters_json_schema == WEATHER["function"]["parameters"]
    assert tool_config.function_calling_config is not None
    assert tool_config.function_calling_config.allowed_function_names == ["get_weather"]
    assert (config.max_output_tokens, config.temperature, config.top_p) == (50, 0.3, 0.9)
    assert config.stop_sequences == ["END"]
    assert (config.response_mime_type, config.response_json_schema) == (
        "application/json",
        {"type": "object"},
    )


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools"),
    ],
)
def test_request_refuses_what_gemini_cannot_honour_naming_the_field(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as err:
        to_gemini_request({"messages": [{"role": "user", "content": "x"}], **extra})

    assert err.value.param == param


def test_request_refuses_an_image_by_url_since_gemini_takes_them_inline() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}

    with pytest.raises(InvalidRequestError):
        to_gemini_request({"messages": [{"role": "user", "content": [image]}]})


def _response(finish: str | None, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body = {"candidates": [candidate], "modelVersion": "gemini-x", "responseId": "r1", **extra}
    types.GenerateContentResponse.model_validate(body)  # the shape Gemini sends
    return body


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("SPII", "content_filter"),
        ("RECITATION", "content_filter"),
        ("OTHER", "stop"),
    ],
)
def test_finish_reason_maps_to_the_chat_finish_reason(finish: str, expected: str) -> None:
    answer = from_gemini_response(_response(finish, [{"text": "x"}]), model="m")

    assert answer["choices"][0]["finish_reason"] == expected


def test_usage_counts_cached_and_thinking_tokens() -> None:
    meta = {
        "promptTokenCount": 100,
        "candidatesTokenCount": 7,
        "cachedContentTokenCount": 60,
        "thoughtsTokenCount": 20,
        "totalTokenCount": 127,
    }
    parts: list[dict[str, Any]] = [{"text": "let me think", "thought": True}, {"text": "42"}]

    answer = from_gemini_response(_response("STOP", parts, usageMetadata=meta), model="m")

    assert answer["usage"]["prompt_tokens"] == 100
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 60
    assert answer["usage"]["completion_tokens"] == 27
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 20
    message = answer["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("42", "let me think")


def test_function_call_answer_is_a_tool_call_with_json_arguments() -> None:
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}

    answer = from_gemini_response(_response("STOP", [call]), model="m")

    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}


def test_blocked_prompt_is_a_refusal_with_content_filter() -> None:
    body = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "responseId": "r"}
    types.GenerateContentResponse.model_validate(body)

    answer = from_gemini_response(body, model="m")

    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "content_filter"
    assert "PROHIBITED_CONTENT" in choice["message"]["refusal"]


def test_stream_is_complete_only_once_the_candidate_finished() -> None:
    translator = GeminiToChatStream("m", include_usage=True)
    first = translator.feed(_response(None, [{"text": "Hel"}]))
    assert not translator.is_complete
    last = translator.feed(
        _response(
            "STOP",
            [{"text": "lo"}],
            usageMetadata={"promptTokenCount": 3, "candidatesTokenCount": 2},
        )
    )

    assert translator.is_complete
    deltas = [c["choices"][0]["delta"] for c in first + last if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content", "") for d in deltas) == "Hello"
    finishes = [c["choices"][0]["finish_reason"] for c in last if c["choices"]]
    assert finishes[-1] == "stop"
    assert last[-1]["usage"]["prompt_tokens"] == 3 and last[-1]["choices"] == []


def test_stream_of_a_blocked_prompt_ends_with_a_refusal() -> None:
    translator = GeminiToChatStream("m", include_usage=False)

    out = translator.feed({"promptFeedback": {"blockReason": "SAFETY"}})

    assert translator.is_complete
    assert "SAFETY" in out[0]["choices"][0]["delta"]["refusal"]
    assert out[-1]["choices"][0]["finish_reason"] == "content_filter"


def test_a_blocked_prompt_ends_a_candidate_that_began_without_a_finish_as_filtered() -> None:
    # A block beside a candidate with no finish reason: the stream waited for a finish that
    # never comes, ending "without a finish reason" (an error, not the refusal), and the
    # whole answer said "stop" with nothing in it.
    blocked: dict[str, Any] = {
        "candidates": [{"content": {"role": "model", "parts": []}, "index": 0}],
        "promptFeedback": {"blockReason": "SAFETY"},
    }
    types.GenerateContentResponse.model_validate(blocked)
    translator = GeminiToChatStream("m", include_usage=False)

    out = translator.feed(blocked)
    answer = from_gemini_response(blocked, model="m")

    assert translator.is_complete
    assert out[-1]["choices"][0]["finish_reason"] == "content_filter"
    assert answer["choices"][0]["finish_reason"] == "content_filter"


@pytest.mark.parametrize("reason", ["IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "MODEL_ARMOR"])
def test_an_image_or_model_armor_filter_finish_is_content_filter(reason: str) -> None:
    answer = from_gemini_response(_response(reason, []), model="m")

    assert answer["choices"][0]["finish_reason"] == "content_filter"


@pytest.mark.parametrize(
    "reason", ["MALFORMED_FUNCTION_CALL", "TOO_MANY_TOOL_CALLS", "MISSING_THOUGHT_SIGNATURE"]
)
def test_a_finish_saying_the_answer_broke_is_a_bad_response_not_an_empty_stop(
    reason: str,
) -> None:
    broken = _response(reason, [])
    translator = GeminiToChatStream("m", include_usage=False)

    with pytest.raises(UpstreamBadResponseError, match=reason) as whole:
        from_gemini_response(broken, model="m")
    with pytest.raises(UpstreamBadResponseError, match=reason) as streamed:
        translator.feed(broken)

    # The request's tools or history make a model answer so, not a sick endpoint.
    assert not whole.value.counts_against_endpoint
    assert not streamed.value.counts_against_endpoint


_THOUGHT = {"text": "let me think", "thought": True}
EMPTY: dict[str, tuple[str | None, list[dict[str, Any]]]] = {
    "no parts": ("STOP", []),
    "empty text": ("STOP", [{"text": ""}]),
    "signed empty text": ("STOP", [{"text": "", "thoughtSignature": "c2ln"}]),
    "only thoughts": ("STOP", [_THOUGHT]),
    "no finishReason": (None, []),
    "other": ("OTHER", []),
    "unsupported language": ("LANGUAGE", [{"text": ""}]),
    "unspecified": ("FINISH_REASON_UNSPECIFIED", [_THOUGHT]),
}


@pytest.mark.parametrize(("finish", "parts"), EMPTY.values(), ids=EMPTY.keys())
def test_a_stop_with_no_text_and_no_call_is_an_empty_answer_not_an_empty_success(
    finish: str | None, parts: list[dict[str, Any]]
) -> None:
    # Gemini's thinking models now and then stop having said nothing: that was relayed as a
    # successful answer whose content was "" (finish_reason stop), and no other route served.
    with pytest.raises(UpstreamBadResponseError) as caught:
        from_gemini_response(_response(finish, parts), model="m")

    assert caught.value.kind == "bad_response" and caught.value.status is None
    assert "invalid response" in caught.value.message and "empty answer" in caught.value.message
    assert ("only thoughts" in caught.value.message) == (parts == [_THOUGHT])


def test_a_whole_answer_with_no_content_at_all_is_an_empty_answer() -> None:
    body: dict[str, Any] = {"candidates": [{"finishReason": "STOP", "index": 0}]}
    types.GenerateContentResponse.model_validate(body)

    with pytest.raises(UpstreamBadResponseError, match="empty answer"):
        from_gemini_response(body, model="m")


@pytest.mark.parametrize("parts", [[], [_THOUGHT]], ids=["no parts", "only thoughts"])
@pytest.mark.parametrize("reason", ["STOP", "OTHER"])
def test_a_stream_that_stops_having_carried_no_text_or_call_is_an_empty_answer(
    parts: list[dict[str, Any]], reason: str
) -> None:
    alone = GeminiToChatStream("m", include_usage=True)
    after = GeminiToChatStream("m", include_usage=True)
    before = after.feed(_response(None, parts))  # a role (and thoughts), no answer yet

    with pytest.raises(UpstreamBadResponseError, match="empty answer"):
        alone.feed(_response(reason, parts))
    with pytest.raises(UpstreamBadResponseError, match="empty answer") as caught:
        after.feed(_response("STOP", [{"text": ""}]))

    assert before[0]["choices"][0]["delta"]["role"] == "assistant"
    assert ("only thoughts" in caught.value.message) == bool(parts)
    assert not alone.is_complete and not after.is_complete


@pytest.mark.parametrize(
    ("reason", "expected"), [("MAX_TOKENS", "length"), ("SAFETY", "content_filter")]
)
def test_a_length_or_filtered_finish_with_no_text_stays_an_answer(
    reason: str, expected: str
) -> None:
    # max_tokens spent on thinking, or a filter: the client's answer, not a broken one.
    body = _response(reason, [_THOUGHT])
    translator = GeminiToChatStream("m", include_usage=False)

    answer = from_gemini_response(body, model="m")
    out = translator.feed(body)

    assert answer["choices"][0]["finish_reason"] == expected
    assert answer["choices"][0]["message"]["content"] == ""
    assert translator.is_complete and out[-1]["choices"][0]["finish_reason"] == expected


def test_thought_signature_of_a_call_comes_back_on_that_call_in_the_next_turn() -> None:
    signature = "CqQBAe/+8Z3d4Q=="  # base64 with + / and padding, as Gemini sends it
    call = {
        "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
        "thoughtSignature": signature,
    }
    answer = from_gemini_response(_response("STOP", [call]), model="m")
    (tool_call,) = answer["choices"][0]["message"]["tool_calls"]

    history = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": tool_call["id"], "content": '{"sky": "sunny"}'},
        ]
    }
    req = to_gemini_request(history)

    assert all(c.isalnum() or c in "_-" for c in tool_call["id"])  # any client's id syntax
    sent = req["contents"][1]["parts"][0]
    assert sent["thoughtSignature"] == signature
    part = types.Part.model_validate(sent)
    assert part.thought_signature is not None and part.function_call is not None
    assert req["contents"][2]["parts"][0]["functionResponse"]["response"] == {"sky": "sunny"}


# -- answers that break GenerateContentResponse's shapes ------------------------------------
# Each raised AttributeError, TypeError or ValueError in the translation (a 500 with a logged
# traceback, or a torn stream), or was relayed as nonsense (a name of 5 as "5", a list of
# args as arguments "[1]"), or silently dropped (a part that was not an object).

_CALL = {"name": "f", "args": {"a": 1}}
MALFORMED: dict[str, dict[str, Any]] = {
    "candidates str": {"candidates": "str"},
    "candidates object": {"candidates": {"content": {}}},
    "candidate str": {"candidates": ["str"]},
    "index str": {"candidates": [{"index": "zero", "finishReason": "STOP"}]},
    "content str": {"candidates": [{"content": "str", "finishReason": "STOP"}]},
    "parts str": {"candidates": [{"content": {"parts": "hi"}, "finishReason": "STOP"}]},
    "part str": {"candidates": [{"content": {"parts": ["hi"]}, "finishReason": "STOP"}]},
    "text int": {"candidates": [{"content": {"parts": [{"text": 5}]}, "finishReason": "STOP"}]},
    "thought str": {
        "candidates": [{"content": {"parts": [{"text": "a", "thought": "yes"}]}}],
    },
    "finishReason int": {
        "candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": 5}]
    },
    "functionCall str": {"candidates": [{"content": {"parts": [{"functionCall": "f"}]}}]},
    "name int": {"candidates": [{"content": {"parts": [{"functionCall": {"name": 5}}]}}]},
    "args list": {
        "candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}],
    },
    "call id int": {"candidates": [{"content": {"parts": [{"functionCall": {**_CALL, "id": 7}}]}}]},
    "signature int": {
        "candidates": [{"content": {"parts": [{"functionCall": _CALL, "thoughtSignature": 1}]}}],
    },
    "promptFeedback str": {"promptFeedback": "blocked"},
    "blockReason list": {"promptFeedback": {"blockReason": ["SAFETY"]}},
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_an_answer_that_breaks_the_types_is_a_bad_response(body: dict[str, Any]) -> None:
    with pytest.raises(UpstreamBadResponseError) as caught:
        from_gemini_response(body, model="m")

    assert caught.value.kind == "bad_response"
    assert "invalid response" in caught.value.message


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_stream_chunk_that_breaks_the_types_is_a_bad_response_after_the_ones_before(
    body: dict[str, Any],
) -> None:
    translator = GeminiToChatStream("m", include_usage=True)
    before = translator.feed(_response(None, [{"text": "Hel"}]))

    with pytest.raises(UpstreamBadResponseError):
        translator.feed(body)

    assert before[0]["choices"][0]["delta"]["content"] == "Hel"
    assert not translator.is_complete


ABSENT: dict[str, dict[str, Any]] = {
    "no candidates": {"candidates": None, "promptFeedback": {"blockReason": "SAFETY"}},
    "null content": {"candidates": [{"content": None, "finishReason": "SAFETY"}]},
    "null parts": {"candidates": [{"content": {"parts": None}, "finishReason": "MAX_TOKENS"}]},
    "null index and text": {
        "candidates": [
            {
                "index": None,
                "content": {"parts": [{"text": None}, {"text": "a"}]},
                "finishReason": "STOP",
            }
        ]
    },
    "nameless call": {"candidates": [{"content": {"parts": [{"functionCall": {"args": None}}]}}]},
}


@pytest.mark.parametrize("body", ABSENT.values(), ids=ABSENT.keys())
def test_what_the_types_leave_out_or_null_is_as_if_empty(body: dict[str, Any]) -> None:
    types.GenerateContentResponse.model_validate(body)  # Gemini may send these

    answer = from_gemini_response(body, model="m")

    (choice,) = answer["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in {
        "stop",
        "length",
        "content_filter",
        "tool_calls",
    }


@pytest.mark.parametrize(
    "meta", ["str", [1], {"promptTokenCount": "a"}, {"promptTokenCount": True}]
)
def test_usage_metadata_that_is_not_sane_leaves_the_usage_unknown(meta: Any) -> None:
    body = _response("STOP", [{"text": "fine"}], usageMetadata=None)
    body["usageMetadata"] = meta

    answer = from_gemini_response(body, model="m")

    assert answer["usage"] is None
    assert answer["choices"][0]["message"]["content"] == "fine"


def test_an_answer_id_or_model_version_that_is_not_a_string_is_replaced() -> None:
    body = {**_response("STOP", [{"text": "fine"}]), "responseId": 5, "modelVersion": [1]}

    answer = from_gemini_response(body, model="m")

    assert (
        answer["model"] == "m"
        and answer["id"].startswith("chatcmpl-")
        and answer["id"] != "chatcmpl-5"
    )
