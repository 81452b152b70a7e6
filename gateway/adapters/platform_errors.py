"""What the cloud platforms' error answers say beyond ``base.error_from_status``: Google's
``Duration`` of a ``RetryInfo``, and the kind of a content-filter refusal. Quota or billing
exhaustion is :data:`schemas.QUOTA_EXHAUSTED` (the key is muted, not cooled).
"""

from __future__ import annotations

CONTENT_FILTER = "content_filter"
"""Error kind of a prompt a platform's content filter refused."""


def google_duration(value: object) -> float | None:
    """Seconds from a protobuf JSON ``Duration`` (``"7s"``, ``"0.5s"``); None otherwise."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return max(0.0, float(value[:-1]))
    except ValueError:
        return None
