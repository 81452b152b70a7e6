"""``carries_token``: which canonical chunks carry part of the answer (what decides a hedged
stream's race and its time to first token)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.base import carries_token

if TYPE_CHECKING:
    from gateway.adapters.base import JSON


def chunk(delta: dict[str, Any] | None, **extra: Any) -> JSON:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        (chunk({"content": "Hi"}), True),
        (chunk({"role": "assistant", "content": "Hi"}), True),
        (chunk({"role": "assistant", "content": None, "tool_calls": [CALL]}), True),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}), True),
        (chunk({"function_call": {"name": "f", "arguments": ""}}), True),
        (chunk({"refusal": "I can't help with that."}), True),
        (chunk({"reasoning_content": "Let me think"}), True),
        (chunk({"reasoning": "Let me think"}), True),
        (chunk({"audio": {"id": "a1", "transcript": "Hi"}}), True),
        (chunk({"role": "assistant"}), False),
        (chunk({"role": "assistant", "content": "", "refusal": None}), False),
        (chunk({"role": "assistant", "content": None, "tool_calls": []}), False),
        (chunk({}), False),  # a finish chunk's delta
        (chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 5}), False),
        ({"object": "chat.completion.chunk", "choices": [{"index": 0}]}, False),
        ({"choices": ["not a choice"]}, False),
    ],
)
def test_carries_token_only_for_answer_text_tool_calls_refusals_or_reasoning(
    c: JSON, expected: bool
) -> None:
    assert carries_token(c) is expected
