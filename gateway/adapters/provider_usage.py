"""A provider's token counts -> canonical chat usage (the Anthropic, Gemini and Bedrock
translators share it)."""

from __future__ import annotations

from typing import Any

from gateway.adapters.base import MAX_TOKENS

JSON = dict[str, Any]


def provider_counts(usage: Any, *keys: str) -> list[int] | None:
    """A provider's token counts under ``keys``, in order (absent or null: 0); None when one
    is not a whole number from 0 to ``base.MAX_TOKENS``, or ``usage`` is neither an object
    nor absent: the answer's usage is then unknown (summing a string failed the request; a
    stream's start, read before any seam checks a usage, billed a cut stream 10**30 tokens
    and lost its log rows)."""
    if usage is None:
        usage = {}
    elif type(usage) is not dict:
        return None
    counts = []
    for key in keys:
        value = usage.get(key)
        if value is None:
            counts.append(0)
        elif type(value) is int and 0 <= value <= MAX_TOKENS:
            counts.append(value)
        elif type(value) is float and value.is_integer() and 0 <= value <= MAX_TOKENS:
            counts.append(int(value))
        else:
            return None
    return counts


def one_hour_writes(usage: Any) -> int:
    """The cache writes with a 1-hour TTL in a provider's usage: Anthropic's
    ``cache_creation.ephemeral_1h_input_tokens``, Converse's ``cacheDetails`` entries with
    ``ttl: 1h`` (sorted 1h first; their ``inputTokens``). 0 when it says none, or not in a
    count: those writes are then priced as 5-minute ones."""
    if type(usage) is not dict:
        return 0
    creation = usage.get("cache_creation")
    if type(creation) is dict:
        return _count(creation.get("ephemeral_1h_input_tokens"))
    details = usage.get("cacheDetails")
    if type(details) is not list:
        return 0
    return sum(
        _count(d.get("inputTokens")) for d in details if type(d) is dict and d.get("ttl") == "1h"
    )


def _count(value: Any) -> int:
    """``value`` as a token count (0 when it is not a whole number from 0)."""
    if type(value) is int and value >= 0:
        return value
    return int(value) if type(value) is float and value.is_integer() and value >= 0 else 0


def cached_usage(counts: list[int] | None, written_1h: int = 0) -> JSON | None:
    """Chat usage from a provider's (fresh input, cache reads, cache writes, output) counts:
    the chat prompt total includes cache reads and writes; ``written_1h`` of the writes had a
    1-hour TTL (``cache_write_1h_tokens``, when some did). None for None."""
    if counts is None:
        return None
    fresh, read, written, completion = counts
    prompt = fresh + read + written
    details = {"cached_tokens": read, "cache_write_tokens": written}
    if written_1h:
        details["cache_write_1h_tokens"] = min(written_1h, written)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }
