"""CapacityLedger: the pure state of one capacity pool, owned by its CapacityActor.

It holds the pool's leases (id -> holder, units, expiry) and, for a quota pool, the count of
the current window. Time is always passed in (``now``), so tests drive it with any clock and
the actor decides when to look again (:meth:`CapacityLedger.next_deadline`).

- concurrency: a lease is a slot; a grant only while fewer than ``limit`` are leased; an
  expired (unrenewed) lease frees its slot.
- quota, ``local``: a lease charges its units to the window at once (1 per request, or a
  token estimate reconciled to the reported usage at release). Calendar windows (hourly /
  daily / monthly) reset on the calendar of the configured time zone; a number is a rolling
  window of that many seconds. An expired quota lease keeps its charge: the request was sent.
- quota, ``http_json``: the count is the source's last reading plus what this owner granted
  since; the pool is unresolved (grants nothing) until the first reading arrives.

Every lease also has a maximum age (``max_age``): renewing never extends it past its grant
time plus that age, so a holder that forgets to release (but keeps renewing) cannot keep a
slot for good.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import msgspec

from schemas import CapacityState, QuotaReading
from schemas.config import LocalQuotaSource

if TYPE_CHECKING:
    from schemas.capacity import PoolSpec

WAITING_FOR_SOURCE = "waiting for the quota source's first reading"


@dataclass(slots=True)
class Lease:
    """One granted lease: who holds it, what it charged, until when it lives unrenewed, and
    the ``deadline`` no renewal extends it past (its grant time plus the maximum age)."""

    holder: str
    endpoint: str
    units: float
    expires_at: float
    charged_in: float  # the calendar window it was charged to (its start), or its grant time
    deadline: float = math.inf

    @property
    def aged_out(self) -> bool:
        """Whether it ends at its maximum age (renewed to the last), not unrenewed."""
        return self.expires_at >= self.deadline


class LedgerSnapshot(msgspec.Struct):
    """What outlives a restart of the owner (or its replacement by a reload): the leases (a
    restarted owner still knows the slots in use; the ones nobody renews expire as before)
    and a ``local`` quota's window and charges, with the pool's ``kind`` and ``unit`` they
    were counted in ("" in a snapshot of an older shape: taken as unchanged)."""

    kind: str = ""
    unit: str = ""
    window_start: float = 0.0
    used: float = 0.0
    charges: dict[str, tuple[float, float]] = {}
    leases: dict[str, tuple[str, str, float, float, float]] = {}
    deadlines: dict[str, float] = {}  # lease id -> its maximum age's end (absent: none)


def window_bounds(window: str, zone: ZoneInfo, now: float) -> tuple[float, float]:
    """(start, end) as epoch seconds of the calendar ``window`` (hourly/daily/monthly) that
    holds ``now`` on the wall clock of ``zone``."""
    local = datetime.fromtimestamp(now, zone)
    if window == "hourly":
        start = local.replace(minute=0, second=0, microsecond=0)
        return start.timestamp(), start.timestamp() + 3600.0
    if window == "daily":
        day = local.date()
        nxt = day + timedelta(days=1)
        return (
            datetime(day.year, day.month, day.day, tzinfo=zone).timestamp(),
            datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).timestamp(),
        )
    if window == "monthly":
        year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        return (
            datetime(local.year, local.month, 1, tzinfo=zone).timestamp(),
            datetime(year, month, 1, tzinfo=zone).timestamp(),
        )
    raise ValueError(f"unknown calendar window {window!r}")


class CapacityLedger:
    """One pool's leases and count. Never raises on unknown lease ids (releasing twice is
    harmless)."""

    def __init__(
        self, spec: PoolSpec, ttl: float, now: float, max_age: float | None = None
    ) -> None:
        self.spec = spec
        self.ttl = ttl
        self.max_age = max_age
        self._leases: dict[str, Lease] = {}
        src = spec.source
        self.unit = "requests" if src is None else src.unit
        self._limit = spec.limit if spec.limit is not None else 0.0
        self._local = isinstance(src, LocalQuotaSource)
        self._rolling: float | None = None
        self._calendar: str | None = None
        self._zone = ZoneInfo("UTC")
        if isinstance(src, LocalQuotaSource):
            if isinstance(src.window, str):
                self._calendar = src.window
                self._zone = ZoneInfo(src.timezone)
            else:
                self._rolling = float(src.window)
        self._used = 0.0  # calendar count; http_json: the last reading
        self._granted_since_reading = 0.0  # http_json
        self._charges: dict[str, tuple[float, float]] = {}  # rolling: id -> (at, units)
        self._window_start, self._resets_at = 0.0, None if self._calendar is None else 0.0
        self.resolved = spec.kind == "concurrency" or self._local
        self.reason = "" if self.resolved else WAITING_FOR_SOURCE
        self.roll(now)

    @property
    def kind(self) -> str:
        """``quota`` or ``concurrency``."""
        return self.spec.kind

    # -- the count ----------------------------------------------------------------------

    def used(self) -> float:
        """What is used now (call :meth:`roll` first to leave a finished window)."""
        if self.kind == "concurrency":
            return float(len(self._leases))
        if self._rolling is not None:
            return sum(units for _, units in self._charges.values())
        return self._used + self._granted_since_reading

    def roll(self, now: float) -> bool:
        """Leave windows that ended by ``now``; True when the count changed."""
        if self._calendar is not None:
            assert self._resets_at is not None
            if now < self._resets_at:
                return False
            had = self._used
            self._window_start, self._resets_at = window_bounds(self._calendar, self._zone, now)
            self._used = 0.0
            return had != 0.0 or self._window_start != 0.0
        if self._rolling is not None:
            horizon = now - self._rolling
            old = [i for i, (at, _) in self._charges.items() if at <= horizon]
            for i in old:
                del self._charges[i]
            return bool(old)
        return False

    # -- leases -------------------------------------------------------------------------

    def acquire(
        self, holder: str, endpoint: str, units: float, now: float, lease_id: str = ""
    ) -> tuple[str, float] | str:
        """Grant a lease: ``(lease_id, expires_at)``, or the reason it is refused.
        ``lease_id``: the id the holder proposes (a lease already held under it is answered
        again, not granted twice); empty: a new one."""
        held = self._leases.get(lease_id) if lease_id else None
        if held is not None:
            return lease_id, held.expires_at
        self.roll(now)
        units = 1.0 if self.kind == "concurrency" or self.unit == "requests" else max(units, 1.0)
        used = self.used()
        if not self.resolved:
            return f"quota source of pool {self.spec.pool!r} is unresolved: {self.reason}"
        if self.kind == "concurrency":
            if used >= self._limit:
                return f"concurrency pool {self.spec.pool!r} is full ({used:g}/{self._limit:g})"
        # A token estimate may overshoot what is left; it is charged once anything is left.
        elif used >= self._limit or (self.unit == "requests" and used + units > self._limit):
            return f"quota pool {self.spec.pool!r} is spent ({used:g}/{self._limit:g} {self.unit})"
        lease_id = lease_id or secrets.token_hex(8)
        charged_in = now if self._rolling is not None else self._window_start
        deadline = math.inf if self.max_age is None else now + self.max_age
        self._leases[lease_id] = Lease(
            holder, endpoint, units, min(now + self.ttl, deadline), charged_in, deadline
        )
        if self.kind == "quota":
            if self._rolling is not None:
                self._charges[lease_id] = (now, units)
            elif self._local:
                self._used += units
            else:
                self._granted_since_reading += units
        return lease_id, self._leases[lease_id].expires_at

    def renew(self, holder: str, lease_ids: tuple[str, ...], now: float) -> int:
        """Extend ``holder``'s leases among ``lease_ids`` by a TTL (never past their maximum
        age); how many were renewed."""
        n = 0
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is not None and lease.holder == holder:
                lease.expires_at = min(now + self.ttl, lease.deadline)
                n += 1
        return n

    def release(self, lease_id: str, used_units: float | None, *, unsent: bool = False) -> bool:
        """Give a lease back; a token quota's charge becomes ``used_units`` when reported, and
        a quota's charge of a request never sent (``unsent``) comes back whole. False for an
        unknown (or already released) lease."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        if self.kind != "quota":
            return True
        if unsent:
            self._reconcile(lease_id, lease, 0.0)
        elif self.unit == "tokens" and used_units is not None:
            self._reconcile(lease_id, lease, max(0.0, used_units))
        return True

    def _reconcile(self, lease_id: str, lease: Lease, actual: float) -> None:
        if self._rolling is not None:
            charge = self._charges.get(lease_id)
            if charge is not None:  # gone: it already left the rolling window
                self._charges[lease_id] = (charge[0], actual)
        elif self._local:
            if lease.charged_in == self._window_start:  # a charge of a past window stays there
                self._used = max(0.0, self._used + actual - lease.units)
        else:
            self._granted_since_reading = max(
                0.0, self._granted_since_reading + actual - lease.units
            )

    def expire(self, now: float) -> list[Lease]:
        """Drop the leases not renewed in time or at their maximum age (their slots come
        back); the dropped ones (:attr:`Lease.aged_out` tells which ended how)."""
        gone = [i for i, lease in self._leases.items() if lease.expires_at <= now]
        return [self._leases.pop(i) for i in gone]

    def drop_leases(self) -> int:
        """Forget every lease at once, as if each expired now (a quota lease keeps its charge:
        the request was sent); how many there were."""
        n = len(self._leases)
        self._leases.clear()
        return n

    def lease_count(self) -> int:
        """How many leases are held now."""
        return len(self._leases)

    def next_deadline(self) -> float | None:
        """The next time the ledger changes by itself: a lease expiring, a window resetting,
        a rolling charge leaving the window. None when nothing is pending."""
        times = [lease.expires_at for lease in self._leases.values()]
        if self._resets_at is not None:
            times.append(self._resets_at)
        if self._rolling is not None and self._charges:
            times.append(min(at for at, _ in self._charges.values()) + self._rolling)
        return min(times) if times else None

    # -- an http_json source ------------------------------------------------------------

    def reading(self, r: QuotaReading) -> bool:
        """Apply a poll of the quota source; True when it changed the pool. A failed poll
        leaves a resolved pool on its last reading (the reason is kept for /health/deep)."""
        if r.error:
            changed = r.error != self.reason
            self.reason = r.error
            return changed
        if r.used is None or (r.limit is None and self.spec.limit is None):
            return False
        self._used = r.used
        self._limit = r.limit if r.limit is not None else self._limit
        self._granted_since_reading = 0.0
        self.resolved, self.reason = True, ""
        return True

    # -- views and persistence ----------------------------------------------------------

    def _frees_at(self) -> float | None:
        """A rolling window's next change: when its oldest charge leaves."""
        assert self._rolling is not None
        oldest = min((at for at, _ in self._charges.values()), default=None)
        return None if oldest is None else oldest + self._rolling

    def state(self, now: float) -> CapacityState:
        """The pool's state to publish."""
        return CapacityState(
            pool=self.spec.pool,
            kind=self.kind,
            limit=self._limit,
            used=self.used(),
            unit=self.unit,
            resolved=self.resolved,
            reason=self.reason,
            resets_at=self._resets_at if self._rolling is None else self._frees_at(),
            endpoints=self.spec.endpoints,
            ts=now,
        )

    def snapshot(self) -> LedgerSnapshot:
        """The leases and the count to persist."""
        leases = {
            i: (x.holder, x.endpoint, x.units, x.expires_at, x.charged_in)
            for i, x in self._leases.items()
        }
        deadlines = {i: x.deadline for i, x in self._leases.items() if x.deadline < math.inf}
        return LedgerSnapshot(
            kind=self.kind,
            unit=self.unit,
            window_start=self._window_start,
            used=self._used,
            charges=dict(self._charges),
            leases=leases,
            deadlines=deadlines,
        )

    def restore(self, snap: LedgerSnapshot, now: float) -> None:
        """Take back a persisted state: the leases (when the pool is still of the same kind:
        a slot is no quota unit), a calendar count if its window is still the current one,
        the rolling charges still inside the window (both only when counted in the same
        unit). An http_json count is not restored: the next reading is the truth."""
        if snap.kind not in ("", self.kind):
            return
        for i, (holder, endpoint, units, expires_at, charged_in) in snap.leases.items():
            # A lease of an older snapshot (no deadline) gets the maximum age from now.
            deadline = snap.deadlines.get(
                i, math.inf if self.max_age is None else now + self.max_age
            )
            self._leases[i] = Lease(
                holder, endpoint, units, min(expires_at, deadline), charged_in, deadline
            )
        if snap.unit not in ("", self.unit):
            return
        if self._calendar is not None and snap.window_start == self._window_start:
            self._used = snap.used
        if self._rolling is not None:
            self._charges.update(snap.charges)
        self.roll(now)
