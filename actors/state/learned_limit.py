"""LearnedLimit: one route's learned concurrency limit, of which RouteLoad
(``actors/state/route_load.py``) keeps one per route (pure state, no I/O; times in seconds
on the owner's clock).

**Learned limit** (AIMD with a gradient cut, as TCP and Netflix's adaptive concurrency
limits): a route's limit is unknown until it shows congestion; until then it takes at most
one and a half times the concurrency it has answered calmly (16 before any answer: TCP's
slow start, gentler because an answer's slot is held for seconds after its first token
says whether it queued; only calm answers widen it), so spilled traffic cannot bury an
unmeasured route in a queue before the first slow answers come back. A provider's 429
halves the limit (an unknown one: from the concurrency it refused at); ModelLoad feeds it
only the 429s that do not report a rate limit's state (a refused pace is cooling's).

A time to first token inflating above the route's own unloaded baseline (``inflation``
times, and at least 100 ms over it; raised by the inflation the model's other routes share,
the least of theirs, since a delay every route shows is the gateway's own or the network's,
not this route's queue) cuts it once three answers in a row say so, each judged by its own
time and sent with at least ``min_limit`` others in flight: to the slots their queue shows
(``slots``: each answer waited its TTFT over the baseline for a slot held as long as a calm
answer holds one, with the others sent before it ahead in line; the median of the three),
else, before any calm answer's hold is known, to the median concurrency they were sent with
times the gradient ceiling / their median TTFT; between a tenth and a half off the median
concurrency they were sent with (the route queued there, so it takes fewer); at most one
cut a second, and never for
an answer sent past the limit in force (sent before the last cut: its queue is already
counted). An answer sent at the limit that came back calm (within half again the baseline:
no queue at all, TCP HyStart's delay test) raises it by one (by ``1/limit`` after a 429,
TCP's congestion avoidance: a refusal comes with no warning), so a limit cut below the knee
is back at it within a few answers, while answers queued a slot or two past the knee stop
its growth there. It never goes under ``min_limit`` (a gateway slowed by its own CPU load,
which no sibling shows, cannot starve a route) nor over the configured ``concurrency:`` cap.

The baseline is the mean time to first token of answers that cannot have queued: sent with
at most one other in flight, or with under half of what the route surely takes (half its
limit, at most half the slow-start 16) and not inflated; the mean of the first ones, then a
moving mean (a tenth per answer; it judges nothing before five), so that neither one lucky
answer nor a long prompt sets the yardstick; an idle answer over the inflation threshold
moves it by a hundredth only, so a provider that became slower for good is followed slowly.
``recent`` is a short EWMA that follows a change within a few answers (what operators see,
and what the other routes' shared inflation is read from).
"""

from __future__ import annotations

import math
import statistics

_CUT_INTERVAL = 1.0  # seconds: one cut per burst of congestion signals
_RATE_LIMIT_CUT = 0.5
_INFLATION_CUT = 0.9
_INFLATION_FLOOR_MS = 100.0
_INFLATED_STREAK = 3  # answers in a row over the threshold: one slow answer is no queue
_BASELINE_ALPHA = 0.1
_BASELINE_DRIFT = 0.01
_BASELINE_MIN = 5  # unloaded answers before the baseline judges any
_RECENT_ALPHA = 0.3
_SLOW_START = 16.0  # in flight a route takes before it has answered any
_SLOW_START_GROWTH = 1.5
_CALM = 1.5  # an answer within this times the baseline showed no queue at all


class LearnedLimit:
    """Owns one route's AIMD concurrency limit and its TTFT baseline."""

    __slots__ = (
        "baseline_ms",
        "cap",
        "hold_ms",
        "inflation",
        "last_cut",
        "limit",
        "min_limit",
        "reason",
        "recent_ms",
        "refused",
        "spent_until",
        "streak",
        "unloaded",
        "window",
    )

    def __init__(self, cap: int | None, min_limit: float = 2.0, inflation: float = 2.0) -> None:
        self.cap = cap
        self.min_limit = min_limit
        self.inflation = inflation
        self.limit: float | None = None  # None: no congestion seen yet
        self.baseline_ms: float | None = None
        self.unloaded = 0  # answers the baseline has taken
        self.recent_ms: float | None = None
        self.hold_ms: float | None = None  # how long a calm answer holds its slot
        self.last_cut = -math.inf
        self.streak: list[tuple[int, float]] = []  # inflated answers in a row (at_send, ms)
        self.reason = ""  # what last changed the limit
        self.refused = False  # the last cut was a provider's 429
        # Slow start (TCP's): until a limit is learned, a route takes at most twice the
        # concurrency it has answered without congestion, so spilled traffic cannot bury a
        # route it has not measured in a queue before the first slow answers come back.
        self.window = _SLOW_START
        # The provider's x-ratelimit-remaining said 0: at its limit until its reset.
        self.spent_until = -math.inf

    def effective(self) -> float | None:
        """The limit in force: the learned one under the configured cap (None: neither)."""
        if self.limit is None:
            return None if self.cap is None else float(self.cap)
        return self.limit if self.cap is None else min(self.limit, float(self.cap))

    def bound(self) -> float:
        """The concurrency the route takes now: its learned limit, else its slow-start
        window."""
        return self.window if self.limit is None else self.limit

    def admits(self, in_flight: int, now: float = -math.inf) -> bool:
        """Whether one more request fits under the learned limit at ``now`` (a cap is the
        capacity pool's to enforce, by lease); never while the provider said its limit is
        spent."""
        return now >= self.spent_until and in_flight < self.bound()

    def rate_limited(self, at_send: int, now: float) -> bool:
        """A 429 for a request sent with ``at_send`` others in flight; True if it cut."""
        known = self.limit
        target = (at_send + 1) if known is None else known
        if not self._cut(target * _RATE_LIMIT_CUT, now, "rate_limited"):
            return False
        self.refused = True
        return True

    def succeeded(
        self,
        ttft_ms: float,
        at_send: int,
        now: float,
        shared: float | None = 1.0,
        held_ms: float | None = None,
    ) -> bool:
        """An answer whose first token took ``ttft_ms`` (and which held its slot
        ``held_ms`` in all, when known), for a request sent with ``at_send`` others in
        flight; True if the limit changed. ``shared``: the inflation every other route of
        the model shows too (the gateway's or the network's delay, not this route's queue),
        by which the threshold is raised; None when it is not known (no other route measured
        yet): judged against its own baseline alone."""
        r = self.recent_ms
        self.recent_ms = ttft_ms if r is None else r + (ttft_ms - r) * _RECENT_ALPHA
        # A yardstick of fewer than a handful of answers judges nothing yet.
        base = self.baseline_ms if self.unloaded >= _BASELINE_MIN else None
        scale = 1.0 if shared is None else max(1.0, shared)
        ceiling = None
        if base is not None:
            ceiling = max(base * self.inflation, base + _INFLATION_FLOOR_MS) * scale
        # Each answer is judged by its own time: the mean of the last few would go on
        # saying "queue" for answers sent after the queue drained, and cut again.
        inflated = ceiling is not None and ttft_ms > ceiling
        known = _SLOW_START if self.limit is None else min(self.limit, _SLOW_START)
        if at_send <= 1 or (at_send < known / 2 and not inflated):
            # Sent with under half what the route surely takes in flight: no queue in it.
            # The mean of the first samples, then a moving mean: one lucky or unlucky
            # first answer must not set the yardstick.
            self.unloaded += 1
            step = max(_BASELINE_ALPHA, 1.0 / self.unloaded)
            if inflated:
                # An idle answer far over the baseline: the provider may have become slower
                # for good, which is followed, but slowly (a hundredth of the gap per answer),
                # so its traffic is not handed back before its limit has been re-learned.
                step = _BASELINE_DRIFT
            prev = self.baseline_ms
            self.baseline_ms = ttft_ms if prev is None else prev + (ttft_ms - prev) * step
        if ceiling is not None and at_send >= self.min_limit:
            # An answer sent past the limit in force was sent before its last cut: its queue
            # is already counted (TCP cuts once per window, not once per lost packet).
            stale = self.limit is not None and at_send >= self.limit
            if not inflated:
                self.streak.clear()
            elif not stale:
                self.streak.append((at_send, ttft_ms))
                del self.streak[:-_INFLATED_STREAK]
                if len(self.streak) == _INFLATED_STREAK and self._inflation_cut(ceiling, now):
                    return True
        # Growth asks more than the absence of a queue worth cutting for: an answer close to
        # the baseline (TCP's HyStart leaves slow start on a small rise in delay, not on a
        # loss), so the limit stops rising a slot or two past the knee instead of at twice it.
        calm = base is None or ttft_ms <= base * _CALM * scale
        if calm and held_ms is not None and held_ms > 0:
            h = self.hold_ms
            self.hold_ms = held_ms if h is None else h + (held_ms - h) * _BASELINE_ALPHA
        if self.limit is None and calm:
            self.window = max(self.window, _SLOW_START_GROWTH * (at_send + 1))
        if self.limit is not None and calm and at_send + 1 >= self.limit - 1:
            # After a refusal, TCP's congestion avoidance (one more per limit's worth of
            # answers): a 429 comes with no warning, and each costs an attempt. After a
            # delay cut, one per calm answer: the delay shows the knee before it hurts.
            grown = self.limit + (1.0 / self.limit if self.refused else 1.0)
            if self.cap is not None:
                grown = min(grown, float(self.cap))
            if grown > self.limit:
                self.limit, self.reason = grown, "grew"
                return True
        return False

    def _inflation_cut(self, ceiling: float, now: float) -> bool:
        """Three answers in a row queued, sent with (their median) ``sent`` others in flight:
        the route takes fewer, so the cut starts there, not from the limit, between a tenth
        and a half off. How many fewer: where a calm answer's slot hold is known, the queue
        each answer waited in says it (``slots``); else the deeper the queue the harder the
        cut (a gradient, as Netflix's adaptive limits). Medians: one answer with a long
        prompt, or sent low by chance, is not the queue."""
        sent = statistics.median(a for a, _ in self.streak)
        base, hold = self.baseline_ms, self.hold_ms
        if base is not None and hold is not None:
            target = statistics.median(slots(a, t - base, hold) for a, t in self.streak)
        else:
            target = sent * ceiling / statistics.median(t for _, t in self.streak)
        target = min(sent * _INFLATION_CUT, max(sent * _RATE_LIMIT_CUT, target))
        if not self._cut(target, now, "ttft_inflated"):
            return False
        self.refused = False
        self.streak.clear()
        return True

    def _cut(self, target: float, now: float, reason: str) -> bool:
        if now - self.last_cut < _CUT_INTERVAL:
            return False
        self.limit = max(self.min_limit, target)
        if self.cap is not None:
            self.limit = min(self.limit, float(self.cap))
        self.last_cut = now
        self.reason = reason
        return True


def slots(at_send: int, wait_ms: float, hold_ms: float) -> float:
    """How many requests a route serves at once, from one answer that waited ``wait_ms``
    for a slot when sent with ``at_send`` others in flight, each slot held ``hold_ms``: in
    a first-come queue it had ``at_send + 1 - c`` ahead of it in line, served at ``c /
    hold`` a millisecond, so ``wait = (at_send + 1 - c) * hold / c``. A queue's depth,
    unlike the TTFT's ratio to its baseline, is read the same whether a slot is held for
    a short answer or a long stream."""
    return (at_send + 1) * hold_ms / (max(wait_ms, 0.0) + hold_ms)
