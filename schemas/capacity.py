"""Capacity leases: quota units and concurrency slots, owned by one actor per pool.

A route with ``provider_type: quota`` or ``concurrency`` draws on a pool: its
``quota_pool:`` / ``concurrency_pool:`` when it names one (routes sharing a subscription),
else a pool of its own named by its endpoint id. The pool's owner (a CapacityActor) is the
only place its count lives, so every ingress process sees one exact number:

- a decision takes a lease (``CapacityAcquire`` -> ``CapacityGrant``) before the plan is
  answered; a refused lease makes the route infeasible for that request;
- the ingress renews its leases while the request runs (``CapacityRenew``, batched) and
  releases each on completion, failure and client cancellation (``CapacityRelease``, with
  the units really used: a token quota is reconciled to the usage the upstream reported);
- a lease not renewed within ``routing.leases.ttl_seconds`` expires: a dead ingress never
  leaks capacity for good;
- the owner publishes ``CapacityState`` on every change, which the ModelActors' views (and
  ``/health/deep``) read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from schemas.config import RouteConfig


class CapacityState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A pool's count, published by its owner on every change.

    ``kind``: ``quota`` (``limit`` units per window, ``used`` so far, ``resets_at`` the wall
    clock of the next reset, None for a rolling window) or ``concurrency`` (``limit`` slots,
    ``used`` leased now). ``resolved`` is False while a quota source has not yet produced a
    reading (the route is not ready; ``reason`` says why).
    """

    pool: str
    kind: str
    limit: float
    used: float
    unit: str = "requests"
    resolved: bool = True
    reason: str = ""
    resets_at: float | None = None
    endpoints: tuple[str, ...] = ()
    ts: float = 0.0

    @property
    def free(self) -> float:
        """What is left of the limit (never negative)."""
        return max(0.0, self.limit - self.used)

    @property
    def used_fraction(self) -> float:
        """``used / limit`` in [0, 1]; 1.0 for a pool with no known limit."""
        return 1.0 if self.limit <= 0 else min(1.0, self.used / self.limit)


class CapacityAcquire(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Take ``units`` (1 slot, 1 request, or a token estimate) from ``pool`` for a request."""

    pool: str
    endpoint: str
    request_id: str
    holder: str
    units: float = 1.0


class CapacityGrant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The owner's answer: ``lease_id`` when granted, else ``reason``; the state after."""

    pool: str
    granted: bool
    lease_id: str = ""
    expires_at: float = 0.0
    reason: str = ""
    state: CapacityState | None = None


class CapacityRenew(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Keep ``lease_ids`` of ``holder`` alive for another TTL (event; unknown ids ignored)."""

    pool: str
    holder: str
    lease_ids: tuple[str, ...]


class CapacityRelease(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Give a lease back; ``used_units`` (when not None) replaces the reserved units in the
    quota count (a token quota reconciled to reported usage). Releasing twice is harmless."""

    pool: str
    lease_id: str
    used_units: float | None = None


class CapacityGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a pool's owner for its current ``CapacityState``."""

    pool: str


def pool_of(route: RouteConfig, endpoint_id: str) -> str | None:
    """The capacity pool a route draws on: its named pool, else one of its own (its endpoint
    id); None for an on-demand route."""
    if route.provider_type == "quota":
        return route.quota_pool or endpoint_id
    if route.provider_type == "concurrency":
        return route.concurrency_pool or endpoint_id
    return None
