"""The prompt estimate (limits' reservations, the context-window check, the bill of an answer
without usage): body bytes / 4, a base64 image counted as at most ``IMAGE_TOKENS``."""

from __future__ import annotations

import msgspec

from gateway.formats.media_tokens import IMAGE_TOKENS
from gateway.formats.openai_chat import (
    estimate_prompt_tokens,
    output_cap,
    prompt_estimate,
    route_needs,
)

PNG = "iVBORw0KGgo" * 40_000  # 440,000 characters of base64


def _estimate(body: object) -> int:
    return prompt_estimate(msgspec.json.encode(body), body)


def test_a_text_body_is_its_bytes_over_four() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40_000}]}
    assert _estimate(body) == len(msgspec.json.encode(body)) // 4


def test_each_base64_image_counts_at_most_image_tokens_in_every_client_shape() -> None:
    chat = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    responses = {"type": "input_image", "image_url": f"data:image/jpeg;base64,{PNG}"}
    claude = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    for part in (chat, responses, claude):
        body = {"model": "m", "messages": [{"role": "user", "content": [part, part]}]}
        rest = len(msgspec.json.encode(body)) - 2 * len(PNG)
        assert (
            rest // 4 + 2 * IMAGE_TOKENS - 20
            <= _estimate(body)
            <= rest // 4 + 2 * IMAGE_TOKENS + 20
        )


def test_a_pdf_and_a_small_image_keep_their_bytes_over_four() -> None:
    pdf = {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PNG}"}}
    small = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4_000}}
    for part in (pdf, small):
        body = {"model": "m", "messages": [{"role": "user", "content": [part] * 3}]}
        assert _estimate(body) == estimate_prompt_tokens(len(msgspec.json.encode(body)))


def test_the_output_cap_is_max_tokens_times_n_and_none_without_one() -> None:
    assert output_cap({"max_completion_tokens": 300, "max_tokens": 9, "n": 3}) == 900
    assert output_cap({"max_tokens": 300}) == 300
    for none in ({}, {"max_tokens": 0}, {"max_tokens": True}, {"max_tokens": 1.5}):
        assert output_cap(none) is None
    # Bounded: a 2**62 passes validation, and would blur the sums a token pace keeps.
    assert output_cap({"max_tokens": 1 << 62, "n": 2}) == 1 << 31


def test_a_route_needs_the_thinking_budget_of_a_request_without_a_cap() -> None:
    text = {"messages": [{"role": "user", "content": "hi"}]}
    assert route_needs({**text, "reasoning_effort": "high"}) == ((), None, 4_096)
    assert (
        route_needs({**text, "thinking": {"type": "enabled", "budget_tokens": 3_000}})[2] == 3_000
    )
    assert (
        route_needs({**text, "thinking": {"type": "disabled"}, "reasoning_effort": "high"})[2] == 0
    )
    # With a cap, Claude is sent the cap (the budget is within it).
    assert route_needs({**text, "reasoning_effort": "high", "max_tokens": 9_000})[1:] == (9_000, 0)
