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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from schemas.config import GatewayConfig, HttpJsonQuotaSource, LocalQuotaSource, RouteConfig


class CapacityState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A pool's count, published by its owner on every change.

    ``kind``: ``quota`` (``limit`` units per window, ``used`` so far, ``resets_at`` the wall
    clock of the next reset; for a rolling window, when its oldest charge leaves it, None
    while it holds none) or ``concurrency`` (``limit`` slots,
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
    # The id the holder proposes for the lease, so it can give back a grant whose answer it
    # never got (its request timed out); asked again, the owner answers with the same lease.
    # Empty: the owner picks one.
    lease_id: str = ""


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
    """Give a lease back; ``used_units`` (when not None) is the usage the upstream reported
    in tokens: a token quota replaces its reserved estimate with it, a request quota and a
    concurrency pool ignore it. ``unsent``: the request never reached the upstream (its
    caller's limits refused it, it was cancelled first, the plan or the request's budget
    never came to it, its route had no adapter), so a quota charges it nothing, in requests
    or in tokens. Releasing twice (or an unknown id) is
    harmless."""

    pool: str
    lease_id: str
    used_units: float | None = None
    unsent: bool = False


class CapacityGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a pool's owner for its current ``CapacityState``."""

    pool: str


class QuotaReading(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An ``http_json`` quota source's poll, sent by the quota poller (a sidecar) to the
    pool's owner: ``used`` and ``limit`` as read, or ``error`` saying why nothing was read
    (unreachable, bad JSON, a path that is missing or not a number). Never a credential."""

    pool: str
    used: float | None = None
    limit: float | None = None
    error: str = ""
    ts: float = 0.0


class QuotaSourceStatus(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Event ``llmgw.events.quota``: a pool's quota source did not resolve (``resolved``
    False, ``reason`` why) or resolved after having failed. ``endpoints`` are its routes."""

    pool: str
    resolved: bool
    reason: str = ""
    endpoints: tuple[str, ...] = ()
    ts: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One capacity pool as the config declares it: what its owner is seeded from.

    ``limit`` is None for an ``http_json`` quota whose limit comes from its source.
    Compares by value, so a reload replaces a pool's owner only when its declaration changed.
    """

    pool: str
    kind: str
    limit: float | None
    source: LocalQuotaSource | HttpJsonQuotaSource | None
    endpoints: tuple[str, ...]


def capacity_pools(config: GatewayConfig) -> dict[str, PoolSpec]:
    """Every capacity pool of ``config`` by name, with the endpoints drawing on it. Raises
    ValueError naming the pool when its routes declare it differently (kind, limit, source)."""
    pools: dict[str, PoolSpec] = {}
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            name = pool_of(route, eid)
            if name is None:
                continue
            spec = _spec_of(name, route)
            seen = pools.get(name)
            if seen is None:
                pools[name] = PoolSpec(name, spec.kind, spec.limit, spec.source, (eid,))
                continue
            if (seen.kind, seen.limit, seen.source) != (spec.kind, spec.limit, spec.source):
                raise ValueError(
                    f"capacity pool {name!r} is declared differently by {seen.endpoints[0]} "
                    f"and {eid} ({_describe(seen)} vs {_describe(spec)}): routes sharing a "
                    "pool must declare the same provider_type, limit and quota_source"
                )
            pools[name] = PoolSpec(name, seen.kind, seen.limit, seen.source, (*seen.endpoints, eid))
    return pools


def _spec_of(name: str, route: RouteConfig) -> PoolSpec:
    if route.provider_type == "concurrency":
        assert route.concurrency is not None  # the route's validator requires it
        return PoolSpec(name, "concurrency", float(route.concurrency.limit), None, ())
    return PoolSpec(
        name, "quota", route.quota.limit if route.quota else None, route.quota_source, ()
    )


def _describe(spec: PoolSpec) -> str:
    source = "" if spec.source is None else f", source {spec.source.kind}"
    return (
        f"{spec.kind}, limit {spec.limit:g}{source}"
        if spec.limit is not None
        else f"{spec.kind}, limit from source{source}"
    )


def pool_of(route: RouteConfig, endpoint_id: str) -> str | None:
    """The capacity pool a route draws on: its named pool, else one of its own (its endpoint
    id); None for an on-demand route."""
    if route.provider_type == "quota":
        return route.quota_pool or endpoint_id
    if route.provider_type == "concurrency":
        return route.concurrency_pool or endpoint_id
    return None
