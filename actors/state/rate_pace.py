"""RatePace: one route's request rate limit (one key's) as its provider reports it, paced so
that the model sends it no request the provider would refuse; RoutePaces: one model's paces
by route and key, and what its routes' answers said is spent (pure state; times in seconds
on the owner's clock).

A provider that meters requests (OpenAI, Azure, Anthropic, most compatible servers) says on
each answer how many requests its limit allows (``limit``), how many were left once it took
that one (``remaining``) and when the whole allowance is back (``reset_seconds``): a bucket
that refills one request every ``reset / (limit - remaining)`` seconds. The answer comes back
a time to first token after its request was sent (a fallback's: after it was moved there),
and the requests sent meanwhile have spent from what it reports; so the estimate is what it
reported, less those, plus what refilled since it was sent, and every request sent to the
route takes one from it (a plan the ingress then never sends gives it back). A route whose
estimate is under one request is spent until one refills: the strategies spill past it
(``LearnedLimit.spent_until``), where without a pace they would have sent it the request its
provider refuses with a 429 and a ``Retry-After`` that keeps it cooling for longer than the
refill. The estimate is only as good as the provider's word: a 429 still cools the route
for what it asks.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.state.route_load import LearnedLimit
    from schemas.routing import RateReport

_NEVER = -math.inf
_UNSENT_KEPT = 1024  # the numbers of plans never sent, per route, kept to correct counts


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
        # A full allowance says nothing of how fast it refills, nor does a reset already
        # past (a clock apart from the provider's): the last refill known stays.
        if used > 0 and report.reset_seconds > 0:
            self._refill = report.reset_seconds / used
        refill = self._refill
        if refill is None:
            return _NEVER
        back = max(0.0, now - sent_at) / refill
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

    def unsent(self, now: float) -> float:
        """A request counted as sent never was: it is given back; returns until when the
        route is spent (-inf: it is not)."""
        if self._refill is None:
            return _NEVER
        self._left = min(self._limit, self._level(now) + 1.0)
        self._at = now
        return self._spent_until(now)

    def _level(self, now: float) -> float:
        refill = self._refill
        if refill is None:
            return self._limit
        # A clock stepped back refills nothing (never a negative refill).
        return min(self._limit, self._left + max(0.0, now - self._at) / refill)

    def _spent_until(self, now: float) -> float:
        if self._left >= 1.0 or self._refill is None:
            return _NEVER
        return now + (1.0 - self._left) * self._refill


class _Lane:
    """One (route, key)'s numbered sends, plans never sent and pace."""

    __slots__ = ("pace", "paced", "sent", "unsent")

    def __init__(self) -> None:
        self.sent = 0  # requests counted as sent, ever
        self.unsent: deque[int] | None = None  # numbers of plans never sent (the last ones)
        self.pace: RatePace | None = None
        self.paced = _NEVER  # its pace says spent until then


class RoutePaces:
    """Owns one model's paces, by route and key (a provider meters each key apart), the
    requests sent on each (numbered, so that a report can tell which were sent after it),
    and until when each route's answers said a limit is spent; keeps each route's
    ``LearnedLimit.spent_until`` the later of what its answers said and when the first of its
    keys (``keys_of``: its declared credential ids; none: the route's own limit, key "")
    has a request back: a route is spent only when all its keys are."""

    def __init__(
        self,
        limits: dict[str, LearnedLimit],
        *,
        enabled: bool = True,
        keys_of: Callable[[str], tuple[str, ...]] = lambda _: (),
    ) -> None:
        self.enabled = enabled  # False: answers' reports pace nothing (what they say is spent)
        self._limits = limits
        self._keys_of = keys_of
        self._lanes: dict[str, dict[str, _Lane]] = {e: {} for e in limits}  # by route, key
        self._said: dict[str, float] = {}  # endpoint -> an answer said spent until then

    def spent(self, endpoint: str, until: float) -> None:
        """``endpoint``'s provider said a limit of it is spent until ``until``."""
        if endpoint in self._limits:
            self._said[endpoint] = max(self._said.get(endpoint, _NEVER), until)
            self._apply(endpoint)

    def sent(self, endpoint: str, key: str, now: float) -> int:
        """Count a request sent to ``endpoint`` with ``key``; returns its number there."""
        lane = self._lanes[endpoint].get(key) or self._lane(endpoint, key)
        lane.sent += 1
        if lane.pace is not None:
            lane.paced = lane.pace.sent(now)
            self._apply(endpoint)
        return lane.sent

    def unsent(self, endpoint: str, key: str, number: int, now: float) -> None:
        """The request counted as ``number`` on ``endpoint`` with ``key`` was never sent (a
        plan the ingress dropped: the caller's limits refused it, a candidate skipped)."""
        lane = self._lane(endpoint, key)
        if lane.unsent is None:
            lane.unsent = deque(maxlen=_UNSENT_KEPT)
        lane.unsent.append(number)
        if lane.pace is not None:
            lane.paced = lane.pace.unsent(now)
            self._apply(endpoint)

    def reported(
        self,
        endpoint: str,
        key: str,
        report: RateReport,
        now: float,
        sent: tuple[float, int] | None,
        in_flight: int,
    ) -> None:
        """An answer of ``endpoint`` with ``key`` reported its request limit's state:
        ``sent``, when and as which number there the reporting request was sent (None: not
        counted there, so every one of the ``in_flight`` may have been sent after it)."""
        if not self.enabled or endpoint not in self._limits:
            return
        lane = self._lane(endpoint, key)
        if lane.pace is None:
            lane.pace = RatePace()
        if sent is None:
            sent_at, since = now, in_flight
        else:
            sent_at, number = sent
            dropped = sum(1 for n in lane.unsent or () if n > number)
            since = max(0, lane.sent - number - dropped)
        lane.paced = lane.pace.reported(report, sent_at, since, now)
        self._apply(endpoint)

    def key_spent(self, endpoint: str, key: str, now: float) -> bool:
        """Whether ``key`` of ``endpoint`` has no request left at ``now``, by its pace."""
        lane = self._lanes.get(endpoint, {}).get(key)
        return lane is not None and lane.paced > now

    def refresh(self, endpoint: str) -> None:
        """``endpoint``'s pool declares other keys now: whether it is spent is read again (a
        key added counts as free, a key removed no longer holds it open)."""
        if endpoint in self._limits:
            self._apply(endpoint)

    def _lane(self, endpoint: str, key: str) -> _Lane:
        lanes = self._lanes[endpoint]
        lane = lanes.get(key)
        if lane is None:
            lane = lanes[key] = _Lane()
        return lane

    def _apply(self, endpoint: str) -> None:
        lanes = self._lanes[endpoint]
        # A key that never reported (or was added since) may be sent: the route is not spent.
        back = min(
            lane.paced if (lane := lanes.get(key)) is not None else _NEVER
            for key in self._keys_of(endpoint) or ("",)
        )
        self._limits[endpoint].spent_until = max(self._said.get(endpoint, _NEVER), back)
