"""CapacityActor: the one owner of a capacity pool (quota units or concurrency slots).

One per pool (``capacity:<pool>``), shared by every route naming that ``quota_pool:`` /
``concurrency_pool:`` (else a pool of the route's own). It grants, renews, releases and
expires leases (:class:`~actors.state.capacity_ledger.CapacityLedger` holds the state), counts the
quota window, persists its leases and a ``local`` quota's count (a restart keeps both; a
reload that removes the pool, the count only: see ``on_stop``), and publishes
``CapacityState`` on every change. For an ``http_json`` source it applies the
quota poller's readings and reports, as a ``quota`` event and a warning log, a source that
does not resolve within its first refresh.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from actors.base import Actor, ActorContext, Cancellable, Serve
from actors.state.capacity_ledger import WAITING_FOR_SOURCE, CapacityLedger, LedgerSnapshot
from schemas import (
    CapacityAcquire,
    CapacityGet,
    CapacityGrant,
    CapacityRelease,
    CapacityRenew,
    QuotaReading,
    QuotaSourceStatus,
    subjects,
)
from schemas.config import HttpJsonQuotaSource, LeaseConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope
    from schemas.capacity import PoolSpec

logger = logging.getLogger(__name__)

_FLUSH_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class _Sweep:
    """Local timer message: expire leases, roll the window."""


@dataclass(frozen=True, slots=True)
class _FirstRefreshDue:
    """Local timer message: an http_json source's first refresh is over."""


@dataclass(frozen=True, slots=True)
class _Flush:
    """Local timer message: persist the quota count."""


class CapacityActor(Actor):
    """Owns pool ``spec.pool``. Answers CapacityAcquire (granted or refused with a reason)
    and CapacityGet; takes CapacityRenew, CapacityRelease and QuotaReading events."""

    def __init__(
        self,
        spec: PoolSpec,
        leases: LeaseConfig,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
        max_age: float | None = None,
    ) -> None:
        self.name = f"capacity:{spec.pool}"
        self._spec = spec
        self._ttl = leases.ttl_seconds
        # None: leases.max_age_seconds (a lease lives that long at most however renewed).
        self._max_age = max_age if max_age is not None else leases.max_age_seconds
        self._snapshots = snapshots
        self._clock = clock
        pool = spec.pool
        self.serves = (
            Serve(subjects.capacity_acquire(pool)),
            Serve(subjects.capacity_renew(pool)),
            Serve(subjects.capacity_release(pool)),
            Serve(subjects.capacity_get(pool)),
            Serve(subjects.capacity_reading(pool)),
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Seed the ledger from the config and the snapshot; publish the first state."""
        self.ctx = ctx
        now = self._clock()
        self.ledger = CapacityLedger(self._spec, self._ttl, now, self._max_age)
        self._timer: Cancellable | None = None
        self._timer_at: float | None = None
        self._flush_due = False
        self._reported = ""  # the unresolved reason last reported (never twice the same)
        # Spec: a source is reported when it did not resolve within its first refresh.
        self._first_refresh_over = False
        if self._snapshots is not None:
            snap = await self._snapshots.load_as(self.name, LedgerSnapshot)
            if snap is not None:
                self.ledger.restore(snap, now)
        source = self._spec.source
        if isinstance(source, HttpJsonQuotaSource):
            ctx.call_later(source.refresh_seconds, _FirstRefreshDue())
        await self._changed()

    async def on_stop(self) -> None:
        """Persist the leases and the quota count; retired (a reload removed the pool), the
        count only."""
        if self.retired:
            # Crashed, restarted, replaced or moved, the owner keeps its leases: they are
            # requests still running, renewed and released by their ingresses. Removed, the
            # pool has no owner for their releases; kept, the pool added back would start
            # with those slots held until their TTL, refusing every request meanwhile.
            dropped = self.ledger.drop_leases()
            if dropped:
                logger.info(
                    "capacity pool %s removed by a reload: %d lease(s) of requests in flight "
                    "dropped (a quota keeps their charge)",
                    self._spec.pool,
                    dropped,
                )
        await self._save()

    async def handle(self, env: Envelope) -> None:
        """Lease requests and events from the ingresses and the quota poller."""
        now = self._clock()
        match env.message:
            case CapacityAcquire() as ask:
                got = self.ledger.acquire(ask.holder, ask.endpoint, ask.units, now, ask.lease_id)
                if isinstance(got, str):
                    await env.respond(
                        CapacityGrant(
                            pool=self._spec.pool,
                            granted=False,
                            reason=got,
                            state=self.ledger.state(now),
                        )
                    )
                    return
                lease_id, expires_at = got
                await env.respond(
                    CapacityGrant(
                        pool=self._spec.pool,
                        granted=True,
                        lease_id=lease_id,
                        expires_at=expires_at,
                        state=self.ledger.state(now),
                    )
                )
                await self._changed()
            case CapacityRenew() as renew:
                self.ledger.renew(renew.holder, renew.lease_ids, now)
            case CapacityRelease() as rel:
                if self.ledger.release(rel.lease_id, rel.used_units, unsent=rel.unsent):
                    await self._changed()
            case CapacityGet():
                rolled = self.ledger.roll(now)
                await env.respond(self.ledger.state(now))
                if rolled:  # a window ended before its timer fired (a clock moved ahead)
                    await self._changed()
            case QuotaReading() as reading:
                was = self.ledger.resolved
                if self.ledger.reading(reading):
                    if self._first_refresh_over or self.ledger.resolved:
                        await self._source_status(was)
                    await self._changed()

    async def handle_local(self, msg: object) -> None:
        """Timers: the sweep, the first refresh deadline, the snapshot flush."""
        if isinstance(msg, _Sweep):
            self._timer = self._timer_at = None
            now = self._clock()
            expired = self.ledger.expire(now)
            for lease in expired:
                if lease.aged_out:  # renewed to the end: some path never released it
                    logger.warning(
                        "capacity lease of %s on pool %s reached its maximum age "
                        "(%gs) unreleased and was expired (holder %s)",
                        lease.endpoint,
                        self._spec.pool,
                        self._max_age,
                        lease.holder,
                    )
                else:
                    logger.info(
                        "capacity lease of %s on %s expired unrenewed (holder %s)",
                        lease.endpoint,
                        self._spec.pool,
                        lease.holder,
                    )
            if self.ledger.roll(now) or expired:
                await self._changed()
            else:
                self._arm()
        elif isinstance(msg, _FirstRefreshDue):
            self._first_refresh_over = True
            if not self.ledger.resolved:
                if self.ledger.reason == WAITING_FOR_SOURCE:
                    self.ledger.reason = "no reading within the first refresh"
                await self._source_status(was=False)
                await self._changed()
        elif isinstance(msg, _Flush):
            self._flush_due = False
            await self._save()

    async def _source_status(self, was: bool) -> None:
        """Report an unresolved source (once per reason), and its recovery."""
        ledger, now = self.ledger, self._clock()
        if ledger.resolved and (not was or self._reported):
            if self._reported:
                logger.warning(
                    "quota source of pool %s (routes %s) resolved",
                    self._spec.pool,
                    ", ".join(self._spec.endpoints),
                )
            self._reported = ""
            await self.ctx.publish(
                subjects.event("quota"),
                QuotaSourceStatus(
                    pool=self._spec.pool, resolved=True, endpoints=self._spec.endpoints, ts=now
                ),
            )
        elif not ledger.resolved and ledger.reason != self._reported:
            self._reported = ledger.reason
            logger.warning(
                "quota source of pool %s (routes %s) did not resolve: %s; those "
                "routes are not drawn",
                self._spec.pool,
                ", ".join(self._spec.endpoints),
                ledger.reason,
            )
            await self.ctx.publish(
                subjects.event("quota"),
                QuotaSourceStatus(
                    pool=self._spec.pool,
                    resolved=False,
                    reason=ledger.reason,
                    endpoints=self._spec.endpoints,
                    ts=now,
                ),
            )

    async def _changed(self) -> None:
        """Publish the state, re-arm the sweep, schedule persisting the count."""
        now = self._clock()
        await self.ctx.publish(subjects.capacity_state(self._spec.pool), self.ledger.state(now))
        self._arm()
        if self._snapshots is not None and not self._flush_due:
            self._flush_due = True
            self.ctx.call_later(_FLUSH_SECONDS, _Flush())

    def _arm(self) -> None:
        """One timer, at the ledger's next deadline (an earlier one replaces it)."""
        deadline = self.ledger.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        # The injected clock says when; the timer runs on the event loop's time.
        self._timer = self.ctx.call_later(max(0.0, deadline - self._clock()), _Sweep())

    async def _save(self) -> None:
        if self._snapshots is not None:
            await self._snapshots.save(
                self.name, msgspec.json.encode(self.ledger.snapshot()), self._clock()
            )
