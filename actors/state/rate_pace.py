"""RatePace: one route's request rate limit as its provider reports it, paced so that the
model sends it no request the provider would refuse (pure state; times in seconds on the
owner's clock).

A provider that meters requests (OpenAI, Azure, most compatible servers) says on each answer
how many requests its limit allows (``limit``), how many were left once it took that one
(``remaining``) and when the whole allowance is back (``reset_seconds``): a bucket that
refills one request every ``reset / (limit - remaining)`` seconds. The answer comes back a
time to first token after its request was sent, and the requests sent meanwhile have spent
from what it reports; so the estimate is what it reported, less those, plus what refilled
since it was sent, and every request sent to the route takes one from it. A route whose
estimate is under one request is spent until one refills: the strategies spill past it
(``LearnedLimit.spent_until``), where without a pace they would have sent it the request its
provider refuses with a 429 and a ``Retry-After`` that keeps it cooling for longer than the
refill. The estimate is only as good as the provider's word: a 429 still cools the route
for what it asks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.routing import RateReport

_NEVER = -math.inf


class RatePace:
    """Owns one route's estimate of the requests its provider's rate limit has left."""

    __slots__ = ("_at", "_left", "_limit", "_refill")

    def __init__(self) -> None:
        self._limit = 0.0
        self._refill: float | None = None  # seconds for one request to come back
        self._left = 0.0  # requests left at ``_at``
        self._at = _NEVER

    def reported(self, report: RateReport, sent_at: float, sent_since: int, now: float) -> float:
        """An answer to a request sent at ``sent_at``, ``sent_since`` requests ago, reported
        ``report``; returns until when the route is spent (-inf: it is not)."""
        self._limit = float(report.limit)
        used = report.limit - report.remaining
        if used > 0:  # a full allowance says nothing of how fast it refills
            self._refill = report.reset_seconds / used
        refill = self._refill
        if refill is None:
            return _NEVER
        back = (now - sent_at) / refill if refill > 0 else self._limit
        self._left = min(self._limit, report.remaining + back) - sent_since
        self._at = now
        return self._spent_until(now)

    def sent(self, now: float) -> float:
        """One request was sent; returns until when the route is spent (-inf: it is not)."""
        if self._refill is None:
            return _NEVER
        self._left = self._level(now) - 1.0
        self._at = now
        return self._spent_until(now)

    def _level(self, now: float) -> float:
        refill = self._refill
        if refill is None or refill <= 0:
            return self._limit
        return min(self._limit, self._left + (now - self._at) / refill)

    def _spent_until(self, now: float) -> float:
        if self._left >= 1.0 or self._refill is None:
            return _NEVER
        return now + (1.0 - self._left) * self._refill
