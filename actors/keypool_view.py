"""The ModelActor's view of its routes' key pools, and the caller bindings it owns.

A plan names the credential of every candidate, so the key choice happens where the plan is
made, from a copy of each pool's declaration and mutes that the pool's owner (KeyPoolActor)
publishes on every change: no bus round trip per request. The bindings (caller -> key for
five minutes) are made by these decisions, so this view owns them.

A route whose pool refuses the caller is not dropped: it is moved after every sendable
candidate and marked (``refusal``), so the ingress accounts for it the way the spec says (a
plain exhaustion counts against the endpoint, a reservation-only refusal does not) and can
answer with the right error when nothing else was sendable.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

from actors.base import Serve
from actors.state.keypool import KeyPool
from bus import Bus, NoRespondersError, RequestTimeoutError
from schemas import (
    KeyPoolExhaustedError,
    KeyPoolState,
    KeyPoolStateRequest,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.config import KeyPoolConfig, ModelConfig, credential_id

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

logger = logging.getLogger(__name__)

_SEED_TIMEOUT = 1.0
# A request that finds this many keys of one route refused in a row has learned that the pool
# is broken, not one key: it moves on to the next route (the refusals mute those keys anyway).
_MAX_SPARES = 3


class _Routed(Protocol):
    @property
    def endpoint(self) -> str: ...
    @property
    def candidate(self) -> RouteCandidate: ...
    @property
    def weight(self) -> float: ...


R = TypeVar("R", bound=_Routed)


def _refused(c: RouteCandidate, err: KeyPoolExhaustedError) -> RouteCandidate:
    return msgspec.structs.replace(
        c, credential_id="", probe=False, refusal=err.code.value, retry_after=err.retry_after
    )


class Screened:
    """One request's key check: the routes its caller can be served by, and the refusals."""

    def __init__(
        self, views: KeyViews, req: RouteRequest, now: float, refused: tuple[RouteCandidate, ...]
    ) -> None:
        self._views = views
        self._req = req
        self._now = now
        self.refused = refused
        self._refused_ids = frozenset(c.endpoint for c in refused)

    def apply(self, candidates: Iterable[RouteCandidate]) -> tuple[RouteCandidate, ...]:
        """``candidates`` with their credentials chosen (binding the caller), then the
        refused routes."""
        out: list[RouteCandidate] = []
        refused = list(self.refused)
        for c in candidates:
            if c.endpoint in self._refused_ids:
                continue
            pool = self._views.pool(c.endpoint)
            if pool is None:
                out.append(c)
                continue
            try:
                cid = pool.acquire(self._req.caller, self._req.role, self._now)
            except KeyPoolExhaustedError as err:
                refused.append(_refused(c, err))
                continue
            # A probe tests the route for its circuit: it is not retried on another key.
            spares = () if c.probe else pool.spares(cid, self._req.role, self._now, _MAX_SPARES)
            if cid != c.credential_id or spares:
                c = msgspec.structs.replace(c, credential_id=cid, spare_credentials=spares)
            out.append(c)
        return (*out, *refused)

    def plan(self, model: str) -> RoutePlan:
        """The plan when every route was refused: only refusals, for the ingress to account."""
        return RoutePlan(model=model, candidates=self.refused, reason="key_pool")


class KeyViews:
    """Owns one model's copy of its pools (declarations and mutes, from their owners) and
    the bindings its plans make."""

    def __init__(self, model: ModelConfig, settings: KeyPoolConfig) -> None:
        self._pools: dict[str, KeyPool] = {}
        self._versions: dict[str, tuple[str, int]] = {}
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            # Until the owner's state arrives: the configured keys (its state adds the rest).
            keys = [(credential_id(s), role) for s, role in route.key_declarations]
            self._pools[eid] = KeyPool(eid, settings, keys)

    @staticmethod
    def serves(model: ModelConfig) -> tuple[Serve, ...]:
        """The pool state subjects a model's view listens to."""
        return tuple(Serve(subjects.keypool_state(e)) for e in model.endpoint_ids())

    def follow_paces(self, spent: Callable[[str, str, float], bool]) -> None:
        """Draw, in every pool of this model, the keys ``spent(endpoint, key, now)`` says have
        no request left after the others (the ModelActor's paces)."""
        for eid, pool in self._pools.items():
            pool.spent = functools.partial(spent, eid)

    def prefer(self, preference: dict[str, float]) -> None:
        """Spend keys in ``preference`` order (lower first) in every pool of this model."""
        for pool in self._pools.values():
            pool.preference = preference

    def pool(self, endpoint: str) -> KeyPool | None:
        """The view of ``endpoint``'s pool."""
        return self._pools.get(endpoint)

    async def seed(self, bus: Bus) -> None:
        """Ask each pool's owner for its state (a missing owner leaves the configured keys)."""
        for pool in self._pools:
            try:
                reply = await bus.request(
                    subjects.keypool_get(pool),
                    KeyPoolStateRequest(),
                    reply_type=KeyPoolState,
                    timeout=_SEED_TIMEOUT,
                )
            except (NoRespondersError, RequestTimeoutError):
                logger.warning("key pool %s did not answer; using its configured keys", pool)
                continue
            if isinstance(reply, KeyPoolState):
                self.update(reply)

    def update(self, st: KeyPoolState) -> None:
        """Fold a newer state of a pool (older ones, and a state of another model's pool,
        are ignored)."""
        pool = self._pools.get(st.pool)
        if pool is None:
            return
        epoch, seq = self._versions.get(st.pool, ("", -1))
        if st.epoch == epoch and st.seq <= seq:
            return
        self._versions[st.pool] = (st.epoch, st.seq)
        dropped = pool.declare([(k.credential_id, k.min_role) for k in st.keys])
        if dropped:
            logger.info("pool %s re-declared: %d caller bindings dropped", st.pool, dropped)
        pool.set_mutes(
            {k.credential_id: k.muted_until for k in st.keys if k.muted_until is not None}
        )
        pool.cooling.merge(st.cooling)

    def rate_limited(self, endpoint: str, cid: str, now: float, retry_after: float | None) -> None:
        """A 429 just observed on ``endpoint``: cool ``cid`` in this copy at once, so the very
        next plan passes over it (the owner's state confirms it a moment later)."""
        pool = self._pools.get(endpoint)
        if pool is not None:
            pool.rate_limited(cid, now, retry_after)

    def succeeded(self, endpoint: str, cid: str) -> None:
        """An answer on ``endpoint`` with ``cid``: its cooling backoff resets in this copy."""
        pool = self._pools.get(endpoint)
        if pool is not None:
            pool.cooling.succeeded(cid)

    def cooling_until(self, endpoint: str, role: str | None, now: float) -> float | None:
        """When ``endpoint`` may serve ``role`` again if cooling is all that holds it out."""
        pool = self._pools.get(endpoint)
        return pool.cooling_until(role, now) if pool is not None else None

    def pinned(self, c: RouteCandidate, role: str | None, now: float) -> RouteCandidate:
        """``c`` for an admin pin: the first key ``role`` may see, muted or not (a pin is a
        debugging aid that must reach its route); refused only when the role sees none."""
        pool = self._pools.get(c.endpoint)
        if pool is None or not pool.declared:
            return c
        cid = pool.preferred(role)
        if cid is None:
            return _refused(c, pool.refusal(role, now))
        return c if cid == c.credential_id else msgspec.structs.replace(c, credential_id=cid)

    def screen(
        self, routes: Sequence[R], req: RouteRequest, now: float
    ) -> tuple[list[R], Screened]:
        """(the routes whose pool can serve ``req``'s caller, the key check to apply).

        Routes of weight 0 pass through untouched: they are never drawn, so never refused.
        """
        usable: list[R] = []
        refused: list[RouteCandidate] = []
        for r in routes:
            pool = self._pools.get(r.endpoint)
            try:
                if pool is not None and r.weight > 0:
                    pool.peek(req.caller, req.role, now)
            except KeyPoolExhaustedError as err:
                refused.append(_refused(r.candidate, err))
                continue
            usable.append(r)
        return usable, Screened(self, req, now, tuple(refused))
