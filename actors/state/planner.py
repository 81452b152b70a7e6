"""The ModelActor's decision as a planner: the views, the request and the clock in; the
plan, the probe leases it needs and what the actor must record out, as data.

:meth:`RoutePlanner.decide` is a generator. It never awaits and never touches the bus: when
the decision needs a route's scarce half-open probe it yields a :class:`ProbeLease`, and the
caller (the ModelActor, or a unit test) sends back whether the probe was granted. It returns
a :class:`Decision`: the plan, and the pin and prefill share the primary takes (the actor
records them; a dry request takes none). The routing order is the spec's: published routes
-> breaker -> modality filter -> explicit pin -> context window -> cooling -> key screening
-> weight and circuit admission -> cooled route back -> session affinity -> the strategy's
draw -> backups -> hedge.

The views it reads (route table, key pools, cooled routes, affinity pins, prefill load,
route load) are the actor's; the planner keeps no state of its own besides the two flags the
actor sets (``degraded``, ``tripped_until``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.state.circuit import CLOSED, HALF_OPEN, OPEN
from actors.state.route_table import RouteEntry, earliest_recovery
from schemas import (
    AllCircuitsOpenError,
    AllRoutesCoolingError,
    InvalidRequestError,
    NoRouteForModalityError,
    PinNotFoundError,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    RouteSkip,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from actors.keypool_view import KeyViews
    from actors.model_load import ModelLoad
    from actors.state.affinity import AffinityTable
    from actors.state.cooling import CooledRoutes
    from actors.state.prefill import PrefillLoad
    from actors.state.route_table import RouteTable
    from actors.strategies import RouteView, RoutingStrategy, StrategyHost
    from schemas.config import ModelConfig, RoutingConfig


@dataclass(frozen=True, slots=True)
class ProbeLease:
    """What the decision must lease before it goes on: ``entry``'s half-open probe. The
    answer sent back is True when its owner granted it."""

    entry: RouteEntry


@dataclass(frozen=True, slots=True)
class Decision:
    """The plan, the primary's share to record (``pin``: the caller's session pin;
    ``prefill``: the un-cached prompt tokens it now prefills; both None on a dry request or
    when not in use) and whether the pins changed (a stale pin dropped)."""

    plan: RoutePlan
    primary: str = ""
    pin: str | None = None
    prefill: int | None = None
    pins_changed: bool = False


def serving(r: RouteEntry, now: float) -> bool:
    """Whether ``r``'s circuit admits traffic now (closed, not benched)."""
    return r.circuit == CLOSED and not r.benched(now)


def probe_eligible(r: RouteEntry, now: float) -> bool:
    """Whether ``r`` may be probed now: open past its cooldown, or half-open with its probe
    free (per the circuit view), and not benched."""
    st = r.state
    if st is None or st.circuit_state == CLOSED or r.benched(now):
        return False
    if st.circuit_state == OPEN:
        return (st.open_until or 0) <= now
    return st.circuit_state == HALF_OPEN and not st.probe_in_flight


@dataclass(slots=True)
class _Pick:
    """The chosen primary: the route, whether it is the half-open probe, why, whether the
    caller's session pins it, whether it takes its prefill share (a backup does not), and
    the views the strategy chose it from when they are the closed routes', in their order
    (the fallback order reads them again)."""

    entry: RouteEntry
    probe: bool
    reason: str
    pin: bool
    share: bool = True
    views: list[RouteView] | None = None  # the strategy's views of every closed route


class RoutePlanner:
    """Decides one model's RoutePlans over the ModelActor's views (see the module). Raises,
    from :meth:`decide`, RouteNotFoundError, NoRouteForModalityError, PinNotFoundError,
    InvalidRequestError (context window), AllRoutesCoolingError and AllCircuitsOpenError."""

    def __init__(
        self,
        model: ModelConfig,
        routing: RoutingConfig,
        *,
        table: RouteTable,
        keys: KeyViews,
        cooled: CooledRoutes,
        affinity: AffinityTable,
        prefill: PrefillLoad,
        load: ModelLoad,
        strategy: RoutingStrategy,
        host: StrategyHost | None,
        router: str,
        spills: bool,
        pins_changed: Callable[[], None],
        spills_for_tokens: bool = False,
    ) -> None:
        self._model = model
        self._routing = routing
        self._table = table
        self._keys = keys
        self._cooled = cooled
        self._affinity = affinity
        self._prefill = prefill
        self._load = load
        self._strategy = strategy
        self._host = host
        self._router = router
        self._spills = spills
        self._spills_for_tokens = spills_for_tokens
        self._pins_changed = pins_changed
        self.degraded = False
        self.tripped_until = 0.0

    def decide(
        self, req: RouteRequest, full: frozenset[str], now: float
    ) -> Generator[ProbeLease, bool, Decision]:
        """The plan for ``req`` without the capacity routes in ``full``; yields each probe
        lease it needs (send back whether it was granted)."""
        self._load.deciding((req.prompt_tokens, req.output_cap, req.thinking_budget))
        if now < self.tripped_until:
            raise AllCircuitsOpenError(
                f"model {self._model.id!r} is paused by its breaker after consecutive failures",
                retry_after=self.tripped_until - now,
            )
        routes = self._table.published()
        if not routes:
            raise RouteNotFoundError(f"model {self._model.id!r} has no published route")
        if req.modalities:
            needed = set(req.modalities)
            routes = [r for r in routes if needed <= r.modalities]
            if not routes:
                raise NoRouteForModalityError(
                    f"no route of model {self._model.id!r} accepts input modalities "
                    f"{', '.join(sorted(needed))}"
                )
        if req.pin:
            pinned = next((r for r in routes if r.endpoint == req.pin), None)
            if pinned is None:
                raise PinNotFoundError(f"X-Route-Pin {req.pin!r} matches no route of this model")
            return Decision(
                RoutePlan(
                    model=self._model.id,
                    pinned=True,
                    reason="pin",
                    candidates=(self._keys.pinned(pinned.candidate, req.role, now),),
                )
            )
        # An embeddings request's prompt is the sum of its inputs, each limited on its own.
        if req.prompt_tokens and req.surface != "embeddings":
            fitting = [r for r in routes if r.fits(req.prompt_tokens)]
            if not fitting:
                widest = max(r.config.context_window or 0 for r in routes)
                raise InvalidRequestError(
                    f"the prompt (about {req.prompt_tokens} tokens) does not fit the context "
                    f"window of any route of model {self._model.id!r} (widest: {widest})",
                    param="messages",
                )
            routes = fitting
        considered = routes
        # A route whose provider asked us to slow down (every key the caller may spend is
        # cooling after a 429) is passed over at once, like an open circuit: no attempt.
        cooling = self._cooling(routes, req, now)
        if cooling:
            routes = [r for r in routes if r.endpoint not in cooling]
            if not routes:
                raise AllRoutesCoolingError(
                    f"every route of model {self._model.id!r} is cooling after its "
                    "provider's rate limit",
                    retry_after=earliest_recovery(considered, now, (), cooling),
                )
        # Routes whose key pool refuses this caller leave the draw (and go last in the plan).
        routes, keys = self._keys.screen(routes, req, now)
        if not routes:
            return Decision(keys.plan(self._model.id))
        drawn = [
            r
            for r in routes
            if r.weight > 0  # a fallback_only route has weight 0
            and r.endpoint not in full
        ]
        backups = [r for r in routes if r.config.fallback_only and r.endpoint not in full]
        spilled: list[RouteEntry] = []
        if self._spills or (self._spills_for_tokens and self._load.tokens_paced):
            drawn, backups, spilled = self._load.spill(
                drawn, backups, lambda r: serving(r, now), saturated=self._spills
            )
        closed = [r for r in drawn if serving(r, now)]
        probing = [r for r in drawn if probe_eligible(r, now)]
        pick: _Pick | None = None
        uncached: dict[str, int] = {}
        if closed or probing:
            uncached = {
                r.endpoint: self._prefill.uncached(req.caller, r.endpoint, req.prompt_tokens, now)
                for r in (*closed, *probing)
            }
            pick = yield from self._choose(req, closed, probing, uncached, now)
        if pick is None:
            # No drawn route can serve: the backups lead, in declaration order.
            pick = yield from self._first_backup(backups, req, now)
            closed = []
        if pick is None:
            # Some of them cooling: the request may wait for the first reset (back-pressure).
            refusal = AllRoutesCoolingError if cooling else AllCircuitsOpenError
            raise refusal(
                f"every route of model {self._model.id!r} is unavailable (circuits open, "
                "benched, probe in flight, cooling or at capacity)",
                retry_after=earliest_recovery(considered, now, keys.refused, cooling),
            )
        entry, probe = pick.entry, pick.probe
        spare = [r for r in backups if serving(r, now)]
        rest = [
            r.candidate
            for r in (*self._fallback_order(closed, entry, req, pick.views), *spare, *spilled)
            if r is not entry
        ]
        if self._strategy.single_route:
            rest = []  # e.g. routewise fallback_mode: strict
        hedge = (
            self._strategy.hedge_after_ms(entry.endpoint, rest[0].endpoint)
            if rest and not probe
            else None
        )
        explained = (
            self._host.rows(
                [
                    r.view(self._prefill.backlog(r.endpoint))
                    for r in drawn
                    if r in (*closed, *probing)
                ],
                req,
            )
            if req.dry and self._host is not None
            else ()
        )
        plan = RoutePlan(
            model=self._model.id,
            candidates=keys.apply((entry.probe_candidate if probe else entry.candidate, *rest)),
            reason=pick.reason,
            routewise=explained,
            hedge_after_ms=hedge,
            skipped=(
                *(RouteSkip(endpoint=e, reason="cooling", until=u) for e, u in cooling.items()),
                *(self._load.skipped(r) for r in spilled),
            ),
        )
        if req.dry or not pick.share:
            return Decision(plan, entry.endpoint)
        return Decision(
            plan,
            entry.endpoint,
            pin=req.caller if pick.pin else None,
            prefill=uncached[entry.endpoint] if self._routing.prefill.enabled else None,
        )

    def _fallback_order(
        self,
        closed: list[RouteEntry],
        entry: RouteEntry,
        req: RouteRequest,
        seen: list[RouteView] | None = None,
    ) -> list[RouteEntry]:
        """The drawn routes after the primary: declaration order, or the strategy's own
        order when it has one (routewise: the LP re-solved without the routes before).
        ``seen``: the views of ``closed`` the primary was chosen from, if so."""
        others = [r for r in closed if r is not entry]
        if not self._strategy.orders_fallbacks or len(others) <= 1:
            return others
        if seen is not None:  # the same decision, no await since: the same views
            views = [v for v in seen if v.index != entry.index]
        else:
            views = self._views(others)
        ordered = self._strategy.fallback_order(views, req, after_select=seen is not None)
        routes = self._table.routes  # a view's index is its route's place there
        return [routes[v.index] for v in ordered]

    def _views(self, routes: list[RouteEntry]) -> list[RouteView]:
        """What the strategy is shown of ``routes``: with their prefill backlog when it reads
        it, else with 0 (each route's view then stays the same object between decisions)."""
        if not self._strategy.reads_backlog:
            return [r.view(0) for r in routes]
        backlog = self._prefill.backlog
        return [r.view(backlog(r.endpoint)) for r in routes]

    def _first_backup(
        self, backups: list[RouteEntry], req: RouteRequest, now: float
    ) -> Generator[ProbeLease, bool, _Pick | None]:
        """The first ``fallback_only`` route that may serve (a half-open one as the probe),
        in declaration order; None when none may."""
        for r in backups:
            if serving(r, now):
                return _Pick(r, False, "fallback_only", False, share=False)
        for r in backups:
            if probe_eligible(r, now) and (yield from self._lease(r, req)):
                return _Pick(r, True, "fallback_only", False, share=False)
        return None

    def _choose(
        self,
        req: RouteRequest,
        closed: list[RouteEntry],
        probing: list[RouteEntry],
        uncached: dict[str, int],
        now: float,
    ) -> Generator[ProbeLease, bool, _Pick | None]:
        """The primary among the drawn routes (and whether it is the half-open probe), and
        why it was chosen; None when none may serve."""
        pre = self._routing.prefill
        cooled = self._cooled.back(
            closed, lambda e: self._keys.cooling_until(e, None, now), now, take=not req.dry
        )
        if cooled is not None:
            return _Pick(cooled, False, "cooled", False)
        if self.degraded:
            # Degraded mode: no exploration; keep to the configured order of what remains,
            # and probe a half-open route only when nothing closed is left.
            if closed:
                return _Pick(closed[0], False, "degraded", False)
            closed = []
        pool = [*closed, *probing]
        if pre.enabled:
            # Elephants skip endpoints already at their elephant limit, unless all are.
            roomy = [
                r
                for r in pool
                if not (
                    self._prefill.is_elephant(uncached[r.endpoint])
                    and self._prefill.elephants(r.endpoint) >= pre.elephant_limit
                )
            ]
            pool = roomy or pool
        reason = self._router
        # Session affinity is the weighted draw's (the spec's FixedRouter's); a strategy that
        # must see every request, like round_robin, opts out with session_affinity = False.
        use_affinity = (
            self._routing.affinity.enabled and bool(req.caller) and self._strategy.session_affinity
        )
        if use_affinity:
            # A caller moved off a route since benched goes back once it is in rotation.
            home = self._affinity.returning(req.caller, self._table.benched(now), mark=not req.dry)
            back = next((r for r in (*closed, *probing) if r.endpoint == home), None)
            if back is not None and (back in closed or (yield from self._lease(back, req))):
                return _Pick(back, back not in closed, "affinity_home", True)
            pinned_id = self._affinity.get(req.caller, now)
            if pinned_id is not None:
                pinned = next((r for r in closed if r.endpoint == pinned_id), None)
                if pinned is None:
                    if not req.dry:
                        self._affinity.drop(req.caller)  # no longer admissible: fresh pick
                        self._pins_changed()
                elif pre.enabled and self._prefill.backlog(pinned_id) > pre.affinity_ceiling:
                    pool = [r for r in pool if r is not pinned] or pool
                    reason = "affinity_abandoned"
                else:
                    return _Pick(pinned, False, "affinity", True)
        # A half-open probe its owner refuses drops that route from the pool and the strategy
        # chooses again without it. (A refused capacity lease re-decides from the actor: the
        # refused route is in ``full`` then, so RouteWise re-solves without it.)
        # The views are the closed routes' while nothing but closed ones is in the pool.
        whole = not probing and len(pool) == len(closed)
        while pool:
            views = self._views(pool)
            pick = self._strategy.select(views, req)
            entry = self._table.routes[pick.index]  # a view's index is its route's place
            if entry in closed:
                return _Pick(entry, False, reason, use_affinity, views=views if whole else None)
            if (yield from self._lease(entry, req)):
                return _Pick(entry, True, "probe", use_affinity)
            pool = [r for r in pool if r is not entry]
            probing = [r for r in probing if r is not entry]
            if not closed and not probing:
                break
        return None

    @staticmethod
    def _lease(r: RouteEntry, req: RouteRequest) -> Generator[ProbeLease, bool, bool]:
        """``r``'s half-open probe for ``req``: leased from its owner by the caller; a dry
        request only asks whether it is free (the circuit view said so), leasing nothing."""
        if req.dry:
            return True
        granted = yield ProbeLease(r)
        return granted

    def _cooling(self, routes: list[RouteEntry], req: RouteRequest, now: float) -> dict[str, float]:
        """The routes among ``routes`` that are cooling for ``req``'s caller, and until when."""
        out: dict[str, float] = {}
        for r in routes:
            until = self._keys.cooling_until(r.endpoint, req.role, now)
            if until is not None:
                out[r.endpoint] = until
        return out
