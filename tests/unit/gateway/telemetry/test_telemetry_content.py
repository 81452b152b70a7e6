"""The content-capture shapes (gateway.telemetry.content) and the convention choices
(gateway.telemetry.semconv): pure functions, no SDK."""

from __future__ import annotations

import json
from typing import Any

from gateway.telemetry.content import answer_choices, dumps, input_messages, output_messages
from gateway.telemetry.semconv import Semconv, capture_content

TOOL_TURNS: dict[str, Any] = {
    "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "wx", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
}


def test_input_messages_map_system_text_images_tool_calls_and_results() -> None:
    system, messages = input_messages(TOOL_TURNS, 16_384)
    assert system == [{"type": "text", "content": "be brief"}]
    assert messages == [
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "wx", "arguments": "{}"}],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}],
        },
    ]


def test_input_messages_past_the_limit_are_cut_then_dropped() -> None:
    body = {"messages": [{"role": "user", "content": 'x"' * 250} for _ in range(1000)]}
    _, messages = input_messages(body, 300)
    assert len(messages) == 1
    text = messages[0]["parts"][0]["content"]
    assert text == ('x"' * 250)[: len(text)]
    assert 250 < len(dumps(messages)) <= 300  # escaped quotes count as exported


def test_output_messages_of_a_whole_answer_keep_text_and_finish_reason() -> None:
    answer = {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}]}
    assert json.loads(dumps(output_messages(answer_choices(answer), 1000))) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Paris."}],
            "finish_reason": "stop",
        }
    ]


def test_semconv_opt_in_list_picks_http_dup_and_latest_genai() -> None:
    assert Semconv.parse("") == Semconv(http_old=False, genai_latest=False)
    assert Semconv.parse("").provider_key == "gen_ai.system"
    chosen = Semconv.parse("database, HTTP/dup,gen_ai_latest_experimental")
    assert chosen == Semconv(http_old=True, genai_latest=True)
    assert chosen.provider_key == "gen_ai.provider.name"
    assert Semconv.parse("http").http_old is False  # stable names only


def test_capture_content_is_on_by_config_or_environment(monkeypatch: Any) -> None:
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    assert (capture_content(False), capture_content(True)) == (False, True)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "True")
    assert capture_content(False) is True
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "false")
    assert capture_content(False) is False
