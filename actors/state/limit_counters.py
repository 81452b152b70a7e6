"""The counters behind limits, pure: sliding 60-second windows, calendar budgets, leases.

Owned by the LimitsActor alone; every method takes ``now`` (epoch seconds) so tests drive
them with an injected clock. One :class:`Counters` per limited subject; a :class:`Lease` is
one admitted request's hold on the counters of each of its subjects:

- admission adds 1 to the request window and the reserved tokens to the token window (at
  the time of admission), one in-flight slot, and the reserved cost to the budget's
  ``reserved``; a request is admitted only if each of these fits what remains;
- settling replaces the reserved tokens and cost by what was used and frees the slot;
- a lease that expires (its ingress stopped renewing it) is settled at its reservation:
  what it really used is unknown, and counting the estimate keeps the limit a limit.
"""

from __future__ import annotations

import calendar
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec

from schemas.limits import LimitSpec

WINDOW_S = 60.0
BUCKET_S = 0.125  # a power of two: whole seconds stamp exactly
# How a refusal names a budget period (schemas.limits.PERIODS).
_ADJECTIVE = {"day": "daily", "week": "weekly", "month": "monthly"}


class _Bucket:
    """What a window counted in one :data:`BUCKET_S` slice, stamped with the slice's end
    (mutable: a settle corrects its amount)."""

    __slots__ = ("amount", "ts")

    def __init__(self, ts: float, amount: float) -> None:
        self.ts = ts
        self.amount = amount


def _stamp(now: float) -> float:
    """The end of the :data:`BUCKET_S` slice holding ``now`` (exact in binary for whole
    seconds, so a window fed on whole seconds slides exactly)."""
    return math.ceil(now / BUCKET_S) * BUCKET_S


def _until_gone(bucket: _Bucket, now: float) -> float:
    """Seconds until ``bucket`` leaves the window, told as at most :data:`WINDOW_S` (what a
    minute's limit promises a client; the slice's end may lie a fraction beyond it)."""
    return min(WINDOW_S, max(0.0, bucket.ts + WINDOW_S - now))


class Window:
    """The sum of amounts counted in the last :data:`WINDOW_S` seconds.

    Amounts are kept per :data:`BUCKET_S` slice, each stamped with its slice's end, so an
    amount leaves the window no sooner than :data:`WINDOW_S` after it was counted (at most
    one slice later): a limit is never exceeded, a window holds at most 480 buckets however
    busy its subject is, and a snapshot of it stays small.
    """

    __slots__ = ("_entries", "_sum")

    def __init__(self) -> None:
        self._entries: deque[_Bucket] = deque()
        self._sum = 0.0

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0].ts <= now - WINDOW_S:
            self._sum -= entries.popleft().amount
        if not entries:
            self._sum = 0.0  # no float drift survives an empty window

    def total(self, now: float) -> float:
        """What the window holds at ``now``."""
        self._expire(now)
        return self._sum

    def add(self, now: float, amount: float) -> _Bucket:
        """Count ``amount`` at ``now``; the bucket lets a settle correct it later."""
        self._expire(now)
        stamp = _stamp(now)
        entries = self._entries
        if entries and entries[-1].ts >= stamp:  # the current slice (or a clock step back)
            bucket = entries[-1]
            bucket.amount += amount
        else:
            bucket = _Bucket(stamp, amount)
            entries.append(bucket)
        self._sum += amount
        return bucket

    def correct(self, bucket: _Bucket, counted: float, amount: float, now: float) -> None:
        """Replace ``counted`` (what one request added to ``bucket``) by ``amount``. Once the
        bucket left the window (a request longer than it), what ``amount`` exceeds
        ``counted`` by is counted now: a long stream does not escape the limit."""
        self._expire(now)
        if bucket.ts > now - WINDOW_S:
            self._sum += amount - counted
            bucket.amount += amount - counted
        elif amount > counted:
            self.add(now, amount - counted)

    def wait_for(self, now: float, need: float, limit: float) -> float:
        """Seconds from ``now`` until ``need`` more fits under ``limit`` (0: it fits now;
        ``inf``: it never will, ``need`` alone is over the limit)."""
        total = self.total(now)
        if total + need <= limit:
            return 0.0
        if need > limit:
            return math.inf
        freed = 0.0
        for entry in self._entries:
            freed += entry.amount
            if total - freed + need <= limit:
                return _until_gone(entry, now)
        return WINDOW_S

    def reset_in(self, now: float) -> float:
        """Seconds until the oldest counted amount leaves the window (0 when empty)."""
        self._expire(now)
        return _until_gone(self._entries[0], now) if self._entries else 0.0

    def bucket_at(self, ts: float) -> _Bucket:
        """The bucket stamped ``ts`` (a restored lease's hold on it); a detached one that
        no correction reaches when it left the window."""
        for entry in self._entries:
            if entry.ts == ts:
                return entry
        return _Bucket(-math.inf, 0.0)

    def dump(self) -> list[tuple[float, float]]:
        """The buckets, for a snapshot."""
        return [(e.ts, e.amount) for e in self._entries]

    @classmethod
    def load(cls, entries: list[tuple[float, float]], now: float) -> Window:
        """A window holding ``entries`` (those still inside it at ``now``)."""
        window = cls()
        for ts, amount in entries:
            if ts > now - WINDOW_S:
                window.add(ts, amount)
        return window


def period_key(period: str, now: float) -> str:
    """The calendar period (UTC) holding ``now``: ``2026-12-01``, ``2026-W49``, ``2026-12``."""
    day = datetime.fromtimestamp(now, UTC)
    if period == "day":
        return day.strftime("%Y-%m-%d")
    if period == "week":
        year, week, _ = day.isocalendar()
        return f"{year}-W{week:02d}"
    return day.strftime("%Y-%m")


def period_end(period: str, now: float) -> float:
    """The epoch second the period holding ``now`` ends (the next one starts)."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        end = day + timedelta(days=1)
    elif period == "week":
        end = day + timedelta(days=7 - day.weekday())
    else:
        days = calendar.monthrange(day.year, day.month)[1]
        end = day.replace(day=1) + timedelta(days=days)
    return end.timestamp()


class CountersSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What of one subject's counters outlives a restart of the owner."""

    requests: list[tuple[float, float]] = []
    tokens: list[tuple[float, float]] = []
    period: str = ""
    spent_usd: float = 0.0
    warned: str = ""
    exhausted: str = ""


@dataclass(slots=True)
class Counters:
    """One subject's counts (the spec that applies is passed in: it may change any time)."""

    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)
    in_flight: int = 0
    period: str = ""
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    warned: str = ""  # the period whose soft threshold was announced
    exhausted: str = ""  # the period whose exhaustion was announced
    # When ``period`` ends, and of which kind it is: a roll is then one comparison.
    _period_end: float = -math.inf
    _period_kind: str = ""

    def roll(self, spec: LimitSpec, now: float) -> None:
        """Start a new budget period when ``now`` left the current one."""
        kind = spec.budget_period
        if now < self._period_end and kind == self._period_kind:
            return
        key = period_key(kind, now)
        if key != self.period:
            self.period, self.spent_usd = key, 0.0
        self._period_end, self._period_kind = period_end(kind, now), kind

    def budget_crossings(self, spec: LimitSpec, now: float) -> list[bool]:
        """The thresholds of ``spec``'s budget crossed in the current period (rolled first)
        and not announced yet, marked announced now: False for the soft threshold, True for
        the whole budget; none without a budget."""
        budget = spec.budget_usd
        if budget is None:
            return []
        self.roll(spec, now)
        crossed = []
        soft = spec.soft_fraction
        if soft is not None and self.spent_usd >= budget * soft and self.warned != self.period:
            self.warned = self.period
            crossed.append(False)
        if self.spent_usd >= budget and self.exhausted != self.period:
            self.exhausted = self.period
            crossed.append(True)
        return crossed

    def snapshot(self) -> CountersSnapshot:
        """The durable part."""
        return CountersSnapshot(
            requests=self.requests.dump(),
            tokens=self.tokens.dump(),
            period=self.period,
            spent_usd=self.spent_usd,
            warned=self.warned,
            exhausted=self.exhausted,
        )

    @classmethod
    def restore(cls, snap: CountersSnapshot, now: float) -> Counters:
        """Counters from a snapshot (leases are not restored: see the actor)."""
        return cls(
            requests=Window.load(snap.requests, now),
            tokens=Window.load(snap.tokens, now),
            period=snap.period,
            spent_usd=snap.spent_usd,
            warned=snap.warned,
            exhausted=snap.exhausted,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not start: ``code`` and seconds until it may."""

    code: str
    message: str
    retry_after: float


def _budget_refusal(spec: LimitSpec, c: Counters, cost: float) -> str:
    """Why ``spec``'s budget refuses a request reserving ``cost``: spent, too little left for
    this request (a smaller ``max_tokens`` may fit), or too little once the reservations of
    requests still running are counted."""
    assert spec.budget_usd is not None
    whole = f"the {_ADJECTIVE[spec.budget_period]} budget of ${spec.budget_usd:g}"
    left = spec.budget_usd - c.spent_usd
    if left <= 0:
        return f"{whole} is spent"
    if cost > left:
        return (
            f"this request may cost up to ${cost:.3g} (its max_tokens at its model's price), "
            f"more than the ${left:.3g} left of {whole}: ask for fewer tokens"
        )
    return (
        f"requests still running hold ${c.reserved_usd:.3g} of the ${left:.3g} left of "
        f"{whole}, too much for this request's ${cost:.3g}"
    )


def check(spec: LimitSpec, c: Counters, tokens: int, cost: float, now: float) -> Refusal | None:
    """Whether one more request reserving ``tokens`` and ``cost`` fits ``spec``."""
    if spec.budget_usd is not None:
        c.roll(spec, now)
        committed = c.spent_usd + c.reserved_usd
        if c.spent_usd >= spec.budget_usd or (cost > 0 and committed + cost > spec.budget_usd):
            return Refusal(
                "budget_exceeded",
                _budget_refusal(spec, c, cost),
                period_end(spec.budget_period, now) - now,
            )
    if spec.concurrency is not None and c.in_flight >= spec.concurrency:
        # A slot frees when a request ends, which no clock can tell: come back in a second.
        return Refusal(
            "rate_limited", f"{spec.concurrency} concurrent requests are already running", 1.0
        )
    if spec.rpm is not None:
        wait = c.requests.wait_for(now, 1, spec.rpm)
        if wait > 0:
            return Refusal(
                "rate_limited", f"the limit of {spec.rpm} requests per minute is reached", wait
            )
    if spec.tpm is not None:
        wait = c.tokens.wait_for(now, tokens, spec.tpm)
        if wait > 0:
            if math.isinf(wait):
                return Refusal(
                    "rate_limited",
                    f"the request may use up to {tokens} tokens, "
                    f"over the limit of {spec.tpm} tokens per minute (lower "
                    "max_tokens)",
                    WINDOW_S,
                )
            return Refusal(
                "rate_limited", f"the limit of {spec.tpm} tokens per minute is reached", wait
            )
    return None


@dataclass(slots=True)
class Hold:
    """One lease's hold on one subject's counters."""

    subject: str
    counters: Counters
    spec: LimitSpec
    request: _Bucket
    tokens: _Bucket


@dataclass(slots=True)
class Lease:
    """An admitted request: its holds, its reservation and when it expires."""

    request_id: str
    ingress: str
    holds: list[Hold]
    tokens: int
    cost_usd: float
    expires: float


Holds = list[tuple[str, LimitSpec, Counters]]
"""(subject, the spec that applies to it, its counters) for each limited subject."""


def admit(
    holds: Holds, request_id: str, ingress: str, tokens: int, cost: float, now: float, ttl: float
) -> Lease | Refusal:
    """Check every subject, then count the request on all of them (all or nothing)."""
    refusals = [r for _, spec, c in holds if (r := check(spec, c, tokens, cost, now)) is not None]
    if refusals:
        # The client must wait for the slowest subject; a budget outranks a rate.
        return max(refusals, key=lambda r: (r.code == "budget_exceeded", r.retry_after))
    taken = []
    for subject, spec, c in holds:
        c.in_flight += 1
        c.reserved_usd += cost
        taken.append(Hold(subject, c, spec, c.requests.add(now, 1), c.tokens.add(now, tokens)))
    return Lease(request_id, ingress, taken, tokens, cost, now + ttl)


def settle(lease: Lease, tokens: int, cost: float, now: float) -> None:
    """Replace the lease's reservation by what it used and free its slots."""
    for hold in lease.holds:
        c = hold.counters
        c.in_flight = max(0, c.in_flight - 1)
        c.reserved_usd = max(0.0, c.reserved_usd - lease.cost_usd)
        c.tokens.correct(hold.tokens, lease.tokens, tokens, now)
        if hold.spec.budget_usd is not None:
            c.roll(hold.spec, now)
        c.spent_usd += cost


def settle_lapsed(lease: Lease, tokens: int, cost: float, expired: float, now: float) -> None:
    """Replace the reservation an expired lease was settled at (at ``expired``) by what it
    used: its settle came after all (its ingress was cut off or the owner slow to come back,
    not dead). A budget period begun since keeps what the old one was counted at."""
    for hold in lease.holds:
        c = hold.counters
        c.tokens.correct(hold.tokens, lease.tokens, tokens, now)
        spec = hold.spec
        if spec.budget_usd is not None:
            c.roll(spec, now)
            if period_key(spec.budget_period, expired) != c.period:
                c.spent_usd += cost
                continue
        c.spent_usd = max(0.0, c.spent_usd + cost - lease.cost_usd)


def count_unleased(holds: Holds, tokens: int, cost: float, now: float, *, request: bool) -> None:
    """Count usage that had no lease (admitted while the owner was unreachable, or whose
    lease a restart of the owner forgot)."""
    for _, spec, c in holds:
        if request:
            c.requests.add(now, 1)
        c.tokens.add(now, tokens)
        if spec.budget_usd is not None:
            c.roll(spec, now)
        c.spent_usd += cost
