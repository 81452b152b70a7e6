"""CapacityViews: a ModelActor's view of the capacity pools its routes draw on, and the
lease its decision takes on the primary.

The view is fed by the pools' ``CapacityState`` events (seeded by a ``CapacityGet`` when the
ModelActor starts), so a full or unresolved pool's routes leave the draw without a bus round
trip. When the plan's primary is a capacity route, its lease is taken from the pool's owner
before the plan is answered; a refusal (another ingress took the last slot meanwhile) drops
that route for this request and the decision is made again without it. Strategies read a
route's pool state through :meth:`CapacityViews.state_of`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from actors.base import Serve
from bus import Bus, NoRespondersError, RequestTimeoutError
from schemas import (
    AllCircuitsOpenError,
    CapacityAcquire,
    CapacityGet,
    CapacityGrant,
    CapacityRelease,
    CapacityState,
    GatewayError,
    Observation,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.capacity import pool_of

if TYPE_CHECKING:
    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

_LEASE_TIMEOUT = 2.0
_UNKNOWN_WAIT = 1.0  # a slot comes back when some request ends: ask again shortly

Decide = Callable[[RouteRequest, frozenset[str]], Awaitable[RoutePlan]]


def _pools(model: ModelConfig) -> dict[str, str]:
    pools: dict[str, str] = {}
    for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
        pool = pool_of(route, eid)
        if pool is not None:
            pools[eid] = pool
    return pools


class CapacityViews:
    """The pool states of one model's capacity routes, and the primary's lease."""

    def __init__(self, model: ModelConfig, holder: str) -> None:
        self._model = model.id
        self._holder = holder
        self._pool_of = _pools(model)
        self._all = set(model.endpoint_ids())
        self._states: dict[str, CapacityState] = {}

    @staticmethod
    def serves(model: ModelConfig) -> tuple[Serve, ...]:
        """The state subjects of the model's pools."""
        return tuple(Serve(subjects.capacity_state(p)) for p in sorted(set(_pools(model).values())))

    async def seed(self, bus: Bus) -> None:
        """Ask each pool's owner for its state (a pool not answering stays unknown: usable)."""
        for pool in set(self._pool_of.values()):
            try:
                reply = await bus.request(
                    subjects.capacity_get(pool),
                    CapacityGet(pool=pool),
                    reply_type=CapacityState,
                    timeout=1.0,
                )
            except (NoRespondersError, RequestTimeoutError):
                continue
            if isinstance(reply, CapacityState):
                self.update(reply)

    def update(self, state: CapacityState) -> None:
        """A pool's newer state."""
        seen = self._states.get(state.pool)
        if seen is None or state.ts >= seen.ts:
            self._states[state.pool] = state

    def state_of(self, endpoint: str) -> CapacityState | None:
        """The state of ``endpoint``'s pool; None for an on-demand route or an unknown pool."""
        pool = self._pool_of.get(endpoint)
        return None if pool is None else self._states.get(pool)

    def blocked(self) -> set[str]:
        """Endpoints whose pool is unresolved or has nothing left, as far as the view knows."""
        out = set()
        for eid, pool in self._pool_of.items():
            st = self._states.get(pool)
            if st is None:
                continue
            # A token quota still serves a request while anything is left (it may overshoot).
            need = 1.0 if st.kind == "concurrency" or st.unit == "requests" else 1e-9
            if not st.resolved or st.free < need:
                out.add(eid)
        return out

    def _wait(self, endpoints: set[str], now: float) -> float:
        """Seconds until the first of ``endpoints``' pools may grant again."""
        waits = []
        for eid in endpoints:
            st = self.state_of(eid)
            if st is not None and st.kind == "quota" and st.resolved and st.resets_at:
                waits.append(max(1.0, st.resets_at - now))
            else:
                waits.append(_UNKNOWN_WAIT)
        return min(waits) if waits else _UNKNOWN_WAIT

    async def decide(self, req: RouteRequest, decide: Decide, bus: Bus, now: float) -> RoutePlan:
        """``decide`` without the routes whose pool is full, then lease the primary's unit or
        slot; a refused lease drops that route and decides again. Raises what ``decide``
        raises; AllCircuitsOpenError (with when capacity comes back) when capacity left
        nothing to serve."""
        skip = self.blocked() if self._pool_of else set()
        while True:
            try:
                plan = await decide(req, frozenset(skip))
            except AllCircuitsOpenError as exc:
                if not skip:
                    raise
                wait = self._wait(skip, now)
                if not self._all <= skip:  # other routes are out for other reasons too
                    wait = min(wait, exc.retry_after or wait)
                # Still the cooling refusal when the other routes are cooling: a request may
                # wait for the first reset (capacity may free before it, never after).
                raise type(exc)(
                    f"{exc}; no capacity left on {', '.join(sorted(skip))}", retry_after=wait
                ) from None
            first = plan.candidates[0] if plan.candidates else None
            if first is None or not first.pool or first.refusal or req.dry:
                return plan
            grant = await self._acquire(bus, first.pool, first.endpoint, req)
            if grant.state is not None:  # the next decision prices this pool as it is now
                self.update(grant.state)
            if grant.granted:
                leased = msgspec.structs.replace(first, lease_id=grant.lease_id)
                return msgspec.structs.replace(plan, candidates=(leased, *plan.candidates[1:]))
            if first.probe:  # the probe was leased for this route: give it back unused
                await bus.publish(
                    subjects.observation(first.endpoint),
                    Observation(
                        endpoint=first.endpoint,
                        model=self._model,
                        outcome="cancelled",
                        attempt=0,
                        probe=True,
                        request_id=req.request_id,
                    ),
                )
            if plan.pinned:
                raise AllCircuitsOpenError(
                    f"pinned route {first.endpoint} has no capacity: {grant.reason}",
                    retry_after=self._wait({first.endpoint}, now),
                )
            skip.add(first.endpoint)

    async def _acquire(
        self, bus: Bus, pool: str, endpoint: str, req: RouteRequest
    ) -> CapacityGrant:
        """Ask ``pool``'s owner for a lease; an owner that does not answer refuses (and a lease
        it may have granted meanwhile is given back by the id it was asked under)."""
        st = self._states.get(pool)
        units = float(max(1, req.prompt_tokens)) if st is not None and st.unit == "tokens" else 1.0
        ask = CapacityAcquire(
            pool=pool,
            endpoint=endpoint,
            request_id=req.request_id,
            holder=req.lease_holder or self._holder,
            units=units,
            lease_id=secrets.token_hex(8),
        )
        try:
            reply = await bus.request(
                subjects.capacity_acquire(pool),
                ask,
                reply_type=CapacityGrant,
                timeout=_LEASE_TIMEOUT,
            )
        except (NoRespondersError, RequestTimeoutError) as exc:
            logger.warning("capacity pool %s did not answer a lease for %s", pool, endpoint)
            if isinstance(exc, RequestTimeoutError):
                # The owner may have granted it and its answer be lost or late (a NATS
                # reconnect): unreleased, it would hold a slot for a TTL serving no one.
                await self._give_back(bus, pool, ask.lease_id)
            return CapacityGrant(pool=pool, granted=False, reason="pool owner not answering")
        if not isinstance(reply, CapacityGrant):
            return CapacityGrant(pool=pool, granted=False, reason="unexpected reply")
        return reply

    @staticmethod
    async def _give_back(bus: Bus, pool: str, lease_id: str) -> None:
        try:
            await bus.publish(
                subjects.capacity_release(pool),
                CapacityRelease(pool=pool, lease_id=lease_id, used_units=0.0, unsent=True),
            )
        except GatewayError as exc:
            logger.warning("capacity release on %s not published: %s", pool, exc)
