"""What the cloud platforms' error answers say beyond ``base.error_from_status``: Google's
``Duration`` of a ``RetryInfo``, and the kind of a content-filter refusal. Quota or billing
exhaustion is :data:`schemas.QUOTA_EXHAUSTED` (the key is muted, not cooled).
"""

from __future__ import annotations

from gateway.adapters.upstream_status import wait_hint

CONTENT_FILTER = "content_filter"
"""Error kind of a prompt a platform's content filter refused."""


def google_duration(value: object) -> float | None:
    """Seconds to wait from a protobuf JSON ``Duration`` (``"7s"``, ``"0.5s"``), at most
    ``LONGEST_WAIT``; None for no wait or anything else (``"1e300s"`` cooled a route for
    good, ``"infs"`` was a 500)."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return wait_hint(float(value[:-1]))
    except ValueError:
        return None
