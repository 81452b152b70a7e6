"""The translating adapters' usage: a provider's counts summed into the chat shape, or None
(unknown) when one is not a whole number from 0. Summing a string count failed the whole
answer with a 500 (a TypeError in the adapter) instead of leaving its usage unknown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters import _anthropic_to_canonical, _gemini_to_canonical, bedrock_wire

if TYPE_CHECKING:
    from collections.abc import Callable


# (chat_usage, its provider's names for: fresh input, cache reads, cache writes, output)
PROVIDERS: dict[str, tuple[Callable[[Any], dict[str, Any] | None], tuple[str, ...]]] = {
    "anthropic": (
        _anthropic_to_canonical.chat_usage,
        ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens"),
    ),
    "bedrock": (
        bedrock_wire.chat_usage,
        ("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens", "outputTokens"),
    ),
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_cache_reads_and_writes_count_in_the_prompt(provider: str) -> None:
    chat_usage, (fresh, read, written, output) = PROVIDERS[provider]

    usage = chat_usage({fresh: 10, read: 5, written: 2.0, output: 7})

    assert usage == {
        "prompt_tokens": 17,
        "completion_tokens": 7,
        "total_tokens": 24,
        "prompt_tokens_details": {"cached_tokens": 5, "cache_write_tokens": 2},
    }
    assert chat_usage(None) is not None  # no usage said: zeros, as before


# Each provider's usage saying 2,000 of its 3,000 cache writes had a 1-hour TTL.
HOUR_WRITES: dict[str, dict[str, Any]] = {
    "anthropic": {
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000}
    },
    "bedrock": {  # botocore's TokenUsage.cacheDetails, sorted 1h first
        "cacheDetails": [{"ttl": "1h", "inputTokens": 2000}, {"ttl": "5m", "inputTokens": 1000}]
    },
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_one_hour_cache_writes_are_carried_in_their_own_detail(provider: str) -> None:
    chat_usage, (fresh, read, written, output) = PROVIDERS[provider]
    counts = {fresh: 10, read: 0, written: 3000, output: 7}

    usage = chat_usage({**counts, **HOUR_WRITES[provider]})

    assert usage is not None
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 3000,
        "cache_write_1h_tokens": 2000,
    }
    plain = chat_usage(counts)  # no split said: every write priced as a 5-minute one
    assert plain is not None and "cache_write_1h_tokens" not in plain["prompt_tokens_details"]


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("bad", ["a", -5, 1.5, True, [1], {"n": 1}])
def test_a_count_that_is_not_a_whole_number_makes_the_usage_unknown(
    provider: str, bad: Any
) -> None:
    chat_usage, (fresh, _, _, output) = PROVIDERS[provider]

    assert chat_usage({fresh: bad, output: 2}) is None
    assert chat_usage({fresh: 2, output: bad}) is None


@pytest.mark.parametrize("bad", ["a", -5, 1.5, True])
def test_gemini_counts_that_are_not_whole_numbers_make_the_usage_unknown(bad: Any) -> None:
    good = {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 3}

    assert _gemini_to_canonical.chat_usage(good) == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert _gemini_to_canonical.chat_usage({**good, "candidatesTokenCount": bad}) is None
