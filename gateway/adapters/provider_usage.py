"""A provider's token counts -> canonical chat usage (the Anthropic, Gemini and Bedrock
translators share it)."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


def provider_counts(usage: Any, *keys: str) -> list[int] | None:
    """A provider's token counts under ``keys``, in order (absent or null: 0); None when one
    is not a whole number from 0, or ``usage`` is neither an object nor absent: the answer's
    usage is then unknown (summing a string failed the request). How large is the adapter
    seam's to judge (``base.MAX_TOKENS``)."""
    if usage is None:
        usage = {}
    elif type(usage) is not dict:
        return None
    counts = []
    for key in keys:
        value = usage.get(key)
        if value is None:
            counts.append(0)
        elif type(value) is int and value >= 0:
            counts.append(value)
        elif type(value) is float and value.is_integer() and value >= 0:
            counts.append(int(value))
        else:
            return None
    return counts


def cached_usage(counts: list[int] | None) -> JSON | None:
    """Chat usage from a provider's (fresh input, cache reads, cache writes, output) counts:
    the chat prompt total includes cache reads and writes. None for None."""
    if counts is None:
        return None
    fresh, read, written, completion = counts
    prompt = fresh + read + written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
    }
