"""Leases of the LimitsActor as data: what a new owner needs to go on holding them.

In a cluster the owner of the limits can be taken over by another host at any moment; an
admitted request still running holds a concurrency slot, a budget reservation and its
reserved tokens, and a new owner that forgot them would let in more than the limit allows.
:func:`dump_lease` turns a :class:`~actors.state.limit_counters.Lease` into a
:class:`LeaseSnapshot`; :func:`restore_lease` takes it back on counters restored from the
same save, re-taking its slot and reservation and finding the window slices it counted in
(so its settle corrects them as it would have on the old owner). :class:`LeaseBook` holds
the running leases by request id and finds those due to expire.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import msgspec

from actors.state.limit_counters import Hold, Lease
from schemas.limits import LimitSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from actors.state.limit_counters import Counters


class HoldSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One lease's hold on one subject: the spec it was admitted under, and the stamps of
    the window slices its request and its reserved tokens were counted in."""

    subject: str
    spec: LimitSpec
    request_ts: float
    tokens_ts: float


class LeaseSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """An admitted request's lease, as saved."""

    request_id: str
    ingress: str
    holds: list[HoldSnapshot]
    tokens: int
    cost_usd: float
    expires: float


def dump_lease(lease: Lease) -> LeaseSnapshot:
    """The durable form of ``lease``."""
    return LeaseSnapshot(
        request_id=lease.request_id,
        ingress=lease.ingress,
        holds=[
            HoldSnapshot(
                subject=h.subject, spec=h.spec, request_ts=h.request.ts, tokens_ts=h.tokens.ts
            )
            for h in lease.holds
        ],
        tokens=lease.tokens,
        cost_usd=lease.cost_usd,
        expires=lease.expires,
    )


def restore_lease(snap: LeaseSnapshot, counters_of: Callable[[str], Counters]) -> Lease:
    """The lease ``snap`` held again on the counters ``counters_of`` gives (each takes its
    slot and its reservation back)."""
    holds = []
    for h in snap.holds:
        c = counters_of(h.subject)
        c.in_flight += 1
        c.reserved_usd += snap.cost_usd
        holds.append(
            Hold(
                h.subject,
                c,
                h.spec,
                c.requests.bucket_at(h.request_ts),
                c.tokens.bucket_at(h.tokens_ts),
            )
        )
    return Lease(snap.request_id, snap.ingress, holds, snap.tokens, snap.cost_usd, snap.expires)


class LeaseBook:
    """The admitted requests' leases by request id, with a heap of their expiries: finding
    the expired ones costs only what is due (it runs on every admission)."""

    __slots__ = ("_deadlines", "_leases")

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap of (expiry, request id)

    def __len__(self) -> int:
        return len(self._leases)

    def leases(self) -> Iterable[Lease]:
        """Every running lease."""
        return self._leases.values()

    def add(self, lease: Lease) -> None:
        """Hold ``lease`` until it is popped or expires."""
        self._leases[lease.request_id] = lease
        heapq.heappush(self._deadlines, (lease.expires, lease.request_id))

    def pop(self, request_id: str) -> Lease | None:
        """The lease of ``request_id``, no longer held (None: none is)."""
        return self._leases.pop(request_id, None)

    def renew(self, request_ids: Iterable[str], expires: float) -> bool:
        """Move the expiry of the leases of ``request_ids`` to ``expires``; whether any was
        held."""
        renewed = False
        for rid in request_ids:
            lease = self._leases.get(rid)
            if lease is not None:
                lease.expires = expires
                renewed = True
        return renewed

    def expired(self, now: float) -> list[Lease]:
        """The leases whose expiry is past at ``now``, no longer held."""
        dead = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, rid = heapq.heappop(heap)
            lease = self._leases.get(rid)
            if lease is None:
                continue  # settled already
            if lease.expires > now:  # renewed since: due later
                heapq.heappush(heap, (lease.expires, rid))
                continue
            dead.append(lease)
            del self._leases[rid]  # a lease added twice has two deadlines: it expires once
        return dead
