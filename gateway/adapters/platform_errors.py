"""What the cloud platforms' error answers mean for routing: a rate limit and when it ends,
a quota or billing exhaustion (mutes the key), a content-filter refusal (the caller's).

Shared by the ``azure_openai`` and ``gemini`` adapters, whose answers say these things in
their own fields rather than in the generic status and ``Retry-After`` that
``base.error_from_status`` reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.adapters.base import retry_after_seconds

if TYPE_CHECKING:
    from collections.abc import Mapping

QUOTA_EXHAUSTED = "quota_exhausted"
"""Error kind of an answer that says a quota or the billing is exhausted (not a pace): the
key-pool mutes the key instead of cooling it for seconds."""

CONTENT_FILTER = "content_filter"
"""Error kind of a prompt a platform's content filter refused."""


def retry_after_or_ms(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` (seconds), else Azure's ``retry-after-ms``; None when neither says."""
    after = retry_after_seconds(headers)
    if after is not None:
        return after
    ms = headers.get("retry-after-ms")
    if ms is None:
        return None
    try:
        return max(0.0, float(ms) / 1000.0)
    except ValueError:
        return None


def google_duration(value: object) -> float | None:
    """Seconds from a protobuf JSON ``Duration`` (``"7s"``, ``"0.5s"``); None otherwise."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return max(0.0, float(value[:-1]))
    except ValueError:
        return None
