"""One page of ``GET /v1/models`` in Anthropic's list shape: the cursor pagination its SDK
drives (``limit``, ``after_id``, ``before_id``; ``has_more``, ``first_id``, ``last_id``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from schemas import InvalidRequestError

__all__ = ["anthropic_page"]

DEFAULT_LIMIT = 20  # Anthropic's
MAX_LIMIT = 1000


def anthropic_page(entries: list[dict[str, Any]], query: bytes) -> dict[str, Any]:
    """The page of ``entries`` (the whole list, in order, each with its ``id``) that the
    query string ``query`` asks for: ``limit`` entries (1 to 1000, default 20) after the
    one ``after_id`` names, or the ``limit`` before the one ``before_id`` names, or the
    first ones. Raises InvalidRequestError for a limit out of range, both cursors, or a
    cursor naming no listed model."""
    params = dict(parse_qsl(query.decode("latin-1")))
    limit = _limit(params.get("limit"))
    ids = [entry["id"] for entry in entries]
    after, before = params.get("after_id"), params.get("before_id")
    if after is not None and before is not None:
        raise InvalidRequestError("after_id, before_id: give at most one", param="before_id")
    if before is not None:
        end = _position(ids, before, "before_id")
        start = max(end - limit, 0)
        more = start > 0
    else:
        start = 0 if after is None else _position(ids, after, "after_id") + 1
        end = min(start + limit, len(entries))
        more = end < len(entries)
    page = entries[start:end]
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    # ASCII digits only: int() also takes "1_0", " 5" and other scripts' digits.
    limit = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 6 else 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(f"limit: must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return limit


def _position(ids: list[str], cursor: str, param: str) -> int:
    try:
        return ids.index(cursor)
    except ValueError:
        raise InvalidRequestError(
            f"{param}: no listed model has the id {cursor[:256]!r}", param=param
        ) from None
