"""ModelActor: owns one public model's routing decisions.

It holds the model's route table (effective weights: configured, admin overrides, the
local/remote split), a view of its endpoints' circuit states (fed by their state events),
session affinity pins and prefill load, and the model's strategy. Every RouteRequest is
answered with a RoutePlan: the primary first, then the other admissible routes in
declaration order, then the admissible ``fallback_only`` routes in declaration order. A
``fallback_only`` route is never drawn; when no drawn route is available (weight 0, circuit
open, benched, keys refused, probe taken), the first backup that is available leads the
plan instead, a half-open one as the probe. A backup whose circuit opened is probed only
then, when it is needed. The only things it asks another owner for at decision time are the
scarce half-open probe lease and, for a quota or concurrency primary, its capacity lease
(actors/capacity_view.py), and only for the route it is about to use. A dry RouteRequest
(routing explain) gets the plan a live one would, leasing nothing and pinning nothing.

Selection follows the spec's order: published routes -> modality filter -> explicit pin ->
context window -> weight and circuit admission -> session affinity -> prefill-aware draw.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from actors.base import Actor, ActorContext, Serve
from actors.capacity_view import CapacityViews
from actors.keypool_view import KeyViews
from actors.model_load import ModelLoad
from actors.state.affinity import AffinityTable
from actors.state.circuit import CLOSED, HALF_OPEN, OPEN
from actors.state.cooling import CooledRoutes
from actors.state.prefill import PrefillLoad
from actors.state.quota import KeyQuota, KeyUsage
from actors.state.route_table import RouteEntry, RouteTable, earliest_recovery
from actors.strategies import RoutingStrategy, StrategyDeps, build_strategy
from actors.strategies.routewise import RouteWiseStrategy
from actors.strategies.routewise.host import ProbeTick, RouteWiseHost
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import (
    AllCircuitsOpenError,
    AllRoutesCoolingError,
    CapacityState,
    EndpointState,
    ErrorCode,
    FirstToken,
    InvalidRequestError,
    KeyPoolState,
    LocalHealth,
    ModeChanged,
    ModelBreakerTripped,
    ModelStatus,
    ModelStatusRequest,
    ModeRequest,
    NoRouteForModalityError,
    Observation,
    PinNotFoundError,
    ProbeGrant,
    ProbeRequest,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    RouteSkip,
    SetWeight,
    StateRequest,
    is_backpressure,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from schemas.config import ModelConfig, RoutingConfig

logger = logging.getLogger(__name__)

_PROBE_LEASE_TIMEOUT = 2.0
_PIN_FLUSH_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _FlushSnapshot:
    """Local timer message: persist pins changed since the last flush."""


class _Snapshot(msgspec.Struct):
    weights: dict[str, float] = {}
    pins: dict[str, tuple[str, float]] = {}
    quota: dict[str, KeyUsage] = {}


class ModelActor(Actor):
    """One per public model id. Answers (as ErrorReply) RouteNotFoundError,
    NoRouteForModalityError, PinNotFoundError, InvalidRequestError (context window, bad
    weight) and AllCircuitsOpenError (with ``retry_after``)."""

    def __init__(
        self,
        model: ModelConfig,
        routing: RoutingConfig,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        self.name = f"model:{model.id}"
        self._seed = seed
        self._model = model
        self._routing = routing
        self._router = model.router or routing.default_router
        self._snapshots = snapshots
        self._clock = clock
        ids = model.endpoint_ids()
        self.serves = (
            Serve(subjects.model_route(model.id)),
            Serve(subjects.model_status(model.id)),
            Serve(subjects.model_weights(model.id)),
            Serve(subjects.model_first_token(model.id)),
            *(Serve(subjects.endpoint_state(e)) for e in ids),
            *(Serve(subjects.observation(e)) for e in ids),
            *(Serve(subjects.endpoint_local_health(e)) for e in ids),
            Serve(subjects.event("mode")),
            *KeyViews.serves(model),
            *CapacityViews.serves(model),
            *(RouteWiseHost.serves(model) if self._router == "routewise" else ()),
        )

    # -- lifecycle ----------------------------------------------------------------------

    async def on_start(self, ctx: ActorContext) -> None:
        """Build routes, strategy and tables; restore the snapshot; seed the circuit view."""
        self.ctx = ctx
        self._table = RouteTable(self._model, self._routing, fixed=self._router == "fixed")
        self._load = ModelLoad(self._model, self._routing, self._clock)
        # The one view of the capacity pools: the decision's lease (plan) and the strategy's
        # effective cost (RouteWise) both read it.
        self.capacity = CapacityViews(self._model, self.name)
        await self.capacity.seed(ctx.bus)
        self._strategy: RoutingStrategy = build_strategy(
            self._router,
            self._model.router_params,
            StrategyDeps(
                prefill=self._routing.prefill,
                model=self._model,
                clock=self._clock,
                capacity=self.capacity.state_of,
                load=self._load.of,
                rng=None if self._seed is None else random.Random(f"{self._seed}:{self.name}"),
            ),
        )
        aff = self._routing.affinity
        self._affinity = AffinityTable(aff.ttl_seconds, aff.sweep_threshold)
        pre = self._routing.prefill
        self._prefill = PrefillLoad(
            elephant_tokens=pre.elephant_tokens, hint_ttl=pre.hint_ttl_seconds
        )
        # Spilling is the fixed router's (RouteWise and round_robin keep their own order).
        self._spills = self._router == "fixed" and self._routing.learned_capacity.enabled
        self._flush_scheduled = False
        self._degraded = False
        self._streak = 0
        self._tripped_until = 0.0
        self._cooled = CooledRoutes()  # routes a 429 took out of rotation, until their reset
        self._keys = KeyViews(self._model, self._routing.key_pool)
        await self._keys.seed(ctx.bus)
        self._quota = KeyQuota(
            {cid: a for r in self._model.route for cid, a in r.allowances.items()}
        )
        await self._restore()
        self._prefer_by_quota()
        self._routewise = (
            RouteWiseHost(self._strategy, self._model, self._clock)
            if isinstance(self._strategy, RouteWiseStrategy)
            else None
        )
        if self._routewise is not None:
            await self._routewise.start(ctx)
        await self._seed_mode(ctx)
        for r in self._table.routes:
            try:
                reply = await ctx.bus.request(
                    subjects.endpoint_get(r.endpoint),
                    StateRequest(),
                    reply_type=EndpointState,
                    timeout=1.0,
                )
            except (NoRespondersError, RequestTimeoutError):
                continue
            if isinstance(reply, EndpointState):
                r.state = reply

    async def _seed_mode(self, ctx: ActorContext) -> None:
        """A restarted ModelActor learns the deployment mode (absent at first boot: normal)."""
        try:
            mode = await ctx.bus.request(
                subjects.MODE_GET, ModeRequest(), reply_type=ModeChanged, timeout=0.5
            )
        except (NoRespondersError, RequestTimeoutError):
            return
        if isinstance(mode, ModeChanged):
            self._degraded = mode.mode == "degraded"

    async def on_stop(self) -> None:
        """Persist pins not yet flushed."""
        await self._save()

    async def _restore(self) -> None:
        if self._snapshots is None:
            return
        snap = await self._snapshots.load_as(self.name, _Snapshot)
        if snap is None:
            return
        self._table.restore_overrides(snap.weights)
        self._affinity.restore(snap.pins, self._clock())
        self._quota.restore(snap.quota)

    async def _save(self, *, durable: bool = False) -> None:
        if self._snapshots is None:
            return
        now = self._clock()
        snap = _Snapshot(
            weights=self._table.overrides(),
            pins=self._affinity.snapshot(now),
            quota=self._quota.snapshot(),
        )
        await self._snapshots.save(self.name, msgspec.json.encode(snap), now, durable=durable)

    def _pins_changed(self) -> None:
        if self._snapshots is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            self.ctx.call_later(_PIN_FLUSH_SECONDS, _FlushSnapshot())

    # -- messages -----------------------------------------------------------------------

    async def handle(self, env: Envelope) -> None:
        """Route and status requests, admin weights, and the events feeding the views."""
        match env.message:
            case RouteRequest() as req:
                await env.respond(await self.plan(req))
            case Observation() as obs:
                self._observed(obs)
            case FirstToken() as ft:
                self._prefill.release(ft.request_id)
                if ft.unsent:
                    self._load.unsent(ft.request_id, ft.endpoint)
                if ft.spent_for is not None:
                    self._load.spent(ft.endpoint, ft.spent_for)
            case EndpointState() as st:
                self._table.update_state(st)
            case SetWeight() as cmd:
                self._table.set_weight(cmd.endpoint, cmd.weight)  # raises InvalidRequestError
                await self._save(durable=True)  # an operator's answer means it is stored
                logger.info(
                    "weight of %s set to %s",
                    cmd.endpoint,
                    "configured" if cmd.weight is None else cmd.weight,
                )
                await env.respond(self.status())
            case LocalHealth() as lh:
                self._table.set_local_health(lh.endpoint, lh.healthy)
            case KeyPoolState() as ks:
                self._keys.update(ks)
            case CapacityState() as cs:
                self.capacity.update(cs)
            case other if self._routewise is not None and self._routewise.feed(other):
                if env.reply is not None:  # the settings hand-over waits until applied
                    await env.respond(self.status())
            case ModeChanged() as mode:
                self._degraded = mode.mode == "degraded"
            case ModelStatusRequest():
                await env.respond(self.status())

    async def handle_local(self, msg: object) -> None:
        """Timers: flush the snapshot; the RouteWise probe round."""
        if isinstance(msg, _FlushSnapshot):
            self._flush_scheduled = False
            await self._save()
        elif isinstance(msg, ProbeTick) and self._routewise is not None:
            now = self._clock()
            await self._routewise.probe_round(
                self.ctx,
                {
                    r.endpoint: r.candidate
                    for r in self._table.published()
                    if r.weight > 0 and self._closed(r, now)
                },
            )

    def _prefer_by_quota(self) -> None:
        """``credential_choice: least_remaining_quota``: the pools spend first the key with
        the least free allowance left (independent of steering's model ranking)."""
        if self._model.credential_choice == "least_remaining_quota":
            self._keys.prefer(self._quota.preference(self._clock()))

    def _observed(self, obs: Observation) -> None:
        now = self._clock()
        if is_backpressure(obs):
            self._keys.rate_limited(obs.endpoint, obs.credential_id, now, obs.retry_after)
            entry = self._table.get(obs.endpoint)
            if entry is not None and entry.weight > 0:
                self._cooled.cooled(obs.endpoint, self._keys.cooling_until(obs.endpoint, None, now))
        elif obs.outcome == "success":
            self._keys.succeeded(obs.endpoint, obs.credential_id)
        event = self._load.observed(obs, now)
        if event is not None:
            if event.reason != "grew":
                logger.info(
                    "route %s learned limit %.1f (%s, %d in flight)",
                    event.endpoint,
                    event.limit,
                    event.reason,
                    event.in_flight,
                )
            self.ctx.start_soon(lambda: self.ctx.publish(subjects.event("capacity"), event))
        if self._quota.learn(obs, now):
            self._prefer_by_quota()
            self._pins_changed()  # the usage is saved with the next snapshot flush
        self._count_for_breaker(obs, now)
        self._prefill.release(obs.request_id)
        if obs.outcome == "success":
            self._prefill.remember(obs.caller, obs.endpoint, obs.prompt_estimate, now)
        elif obs.outcome in ("failure", "client_error") and obs.caller:
            # Spec: any error from the pinned endpoint drops the pin.
            if self._affinity.drop(obs.caller, obs.endpoint):
                self._pins_changed()
        self._strategy.observe(obs)

    def _count_for_breaker(self, obs: Observation, now: float) -> None:
        """The optional per-model breaker: N consecutive failed attempts, any route."""
        limit = self._routing.bench.model_breaker_failures
        if not limit or obs.outcome not in ("success", "failure"):
            return
        if obs.error_kind == ErrorCode.KEY_POOL_EXHAUSTED.value or is_backpressure(obs):
            return  # a key-pool refusal sent nothing upstream; a 429 is back-pressure
        self._streak = 0 if obs.outcome == "success" else self._streak + 1
        if self._streak >= limit and now >= self._tripped_until:
            self._tripped_until = now + self._routing.circuit.cooldown_seconds
            self._streak = 0
            logger.warning(
                "model %s breaker tripped after %d consecutive failures", self._model.id, limit
            )
            self.ctx.start_soon(
                lambda: self.ctx.publish(
                    subjects.event("model_breaker"),
                    ModelBreakerTripped(
                        model=self._model.id, failures=limit, until=self._tripped_until, ts=now
                    ),
                )
            )

    def status(self) -> ModelStatus:
        """Routes with effective weights and the circuits this actor sees; for RouteWise, each
        admissible route's effective cost, latency estimate and LP weight."""
        now = self._clock()
        st = self._table.status(self._router)
        st = msgspec.structs.replace(
            st,
            routes=tuple(
                self._load.status(r, self._keys.cooling_until(r.endpoint, None, now))
                for r in st.routes
            ),
        )
        if self._routewise is None:
            return st
        live = [
            r.view(self._prefill.backlog(r.endpoint))
            for r in self._table.published()
            if r.weight > 0 and self._closed(r, now)
        ]
        tokens = self._routewise.strategy.last_prompt_tokens
        rows = self._routewise.rows(live, RouteRequest(model=self._model.id, prompt_tokens=tokens))
        return msgspec.structs.replace(st, routewise=rows, routewise_prompt_tokens=tokens)

    # -- the decision -------------------------------------------------------------------

    async def plan(self, req: RouteRequest) -> RoutePlan:
        """Decide which routes serve ``req``, primary first, with the primary's capacity lease
        taken (actors/capacity_view.py). Raises GatewayError subclasses."""
        plan = await self.capacity.decide(req, self._decide, self.ctx.bus, self._clock())
        if not req.dry:
            self._load.issued(req.request_id, plan, self._clock())
        return plan

    async def _decide(self, req: RouteRequest, full: frozenset[str]) -> RoutePlan:
        """The plan for ``req`` without the capacity routes in ``full``."""
        now = self._clock()
        if now < self._tripped_until:
            raise AllCircuitsOpenError(
                f"model {self._model.id!r} is paused by its breaker after consecutive failures",
                retry_after=self._tripped_until - now,
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
            return RoutePlan(
                model=self._model.id,
                pinned=True,
                reason="pin",
                candidates=(self._keys.pinned(pinned.candidate, req.role, now),),
            )
        if req.prompt_tokens:
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
            return keys.plan(self._model.id)
        drawn = [
            r
            for r in routes
            if r.weight > 0  # a fallback_only route has weight 0
            and r.endpoint not in full
        ]
        backups = [r for r in routes if r.config.fallback_only and r.endpoint not in full]
        spilled: list[RouteEntry] = []
        if self._spills:
            drawn, backups, spilled = self._load.spill(
                drawn, backups, lambda r: self._closed(r, now)
            )
        closed = [r for r in drawn if self._closed(r, now)]
        probing = [r for r in drawn if self._probe_eligible(r, now)]
        primary, reason = None, "fallback_only"
        if closed or probing:
            primary, reason = await self._choose(req, closed, probing, now)
        if primary is None:
            # No drawn route can serve: the backups lead, in declaration order.
            primary, reason = await self._first_backup(backups, req, now), "fallback_only"
            closed = []
        if primary is None:
            # Some of them cooling: the request may wait for the first reset (back-pressure).
            refusal = AllRoutesCoolingError if cooling else AllCircuitsOpenError
            raise refusal(
                f"every route of model {self._model.id!r} is unavailable (circuits open, "
                "benched, probe in flight, cooling or at capacity)",
                retry_after=earliest_recovery(considered, now, keys.refused, cooling),
            )
        entry, probe = primary
        spare = [r for r in backups if self._closed(r, now)]
        rest = [
            r.candidate
            for r in (*self._fallback_order(closed, entry, req), *spare, *spilled)
            if r is not entry
        ]
        if getattr(self._strategy, "single_route", False):
            rest = []  # routewise fallback_mode: strict
        hedge = (
            self._routewise.strategy.hedge_after_ms(entry.endpoint, rest[0].endpoint)
            if self._routewise is not None and rest and not probe
            else None
        )
        explained = (
            self._routewise.rows(
                [
                    r.view(self._prefill.backlog(r.endpoint))
                    for r in drawn
                    if r in (*closed, *probing)
                ],
                req,
            )
            if req.dry and self._routewise is not None
            else ()
        )
        return RoutePlan(
            model=self._model.id,
            candidates=keys.apply((entry.probe_candidate if probe else entry.candidate, *rest)),
            reason=reason,
            routewise=explained,
            hedge_after_ms=hedge,
            skipped=(
                *(RouteSkip(endpoint=e, reason="cooling", until=u) for e, u in cooling.items()),
                *(self._load.skipped(r) for r in spilled),
            ),
        )

    def _fallback_order(
        self, closed: list[RouteEntry], entry: RouteEntry, req: RouteRequest
    ) -> list[RouteEntry]:
        """The drawn routes after the primary: declaration order, or the strategy's own
        order when it has one (routewise: the LP re-solved without the routes before)."""
        order = getattr(self._strategy, "fallback_order", None)
        others = [r for r in closed if r is not entry]
        if order is None or len(others) <= 1:
            return others
        by_endpoint = {r.endpoint: r for r in others}
        views = [r.view(self._prefill.backlog(r.endpoint)) for r in others]
        return [by_endpoint[v.endpoint] for v in order(views, req)]

    async def _first_backup(
        self, backups: list[RouteEntry], req: RouteRequest, now: float
    ) -> tuple[RouteEntry, bool] | None:
        """The first ``fallback_only`` route that may serve (and whether it is a half-open
        probe), in declaration order; None when none may."""
        for r in backups:
            if self._closed(r, now):
                return r, False
        for r in backups:
            if self._probe_eligible(r, now) and await self._lease_probe(r, req):
                return r, True
        return None

    async def _choose(
        self, req: RouteRequest, closed: list[RouteEntry], probing: list[RouteEntry], now: float
    ) -> tuple[tuple[RouteEntry, bool] | None, str]:
        """The primary (and whether it is the half-open probe) and why it was chosen."""
        pre = self._routing.prefill
        uncached = {
            r.endpoint: self._prefill.uncached(req.caller, r.endpoint, req.prompt_tokens, now)
            for r in (*closed, *probing)
        }
        cooled = self._cooled.back(
            closed, lambda e: self._keys.cooling_until(e, None, now), now, take=not req.dry
        )
        if cooled is not None:
            self._commit(req, cooled, uncached, now, use_affinity=False)
            return (cooled, False), "cooled"
        if self._degraded:
            # Degraded mode: no exploration; keep to the configured order of what remains,
            # and probe a half-open route only when nothing closed is left.
            for entry in closed:
                self._commit(req, entry, uncached, now, use_affinity=False)
                return (entry, False), "degraded"
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
            self._routing.affinity.enabled
            and bool(req.caller)
            and getattr(self._strategy, "session_affinity", True)
        )
        if use_affinity:
            # A caller moved off a route since benched goes back once it is in rotation.
            home = self._affinity.returning(req.caller, self._table.benched(now), mark=not req.dry)
            back = next((r for r in (*closed, *probing) if r.endpoint == home), None)
            if back is not None and (back in closed or await self._lease_probe(back, req)):
                self._commit(req, back, uncached, now, use_affinity)
                return (back, back not in closed), "affinity_home"
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
                    self._commit(req, pinned, uncached, now, use_affinity)
                    return (pinned, False), "affinity"
        # A half-open probe its owner refuses drops that route from the pool and the strategy
        # chooses again without it. (A refused capacity lease re-decides from ``plan``: the
        # refused route is in ``full`` then, so RouteWise re-solves without it.)
        while pool:
            views = [r.view(self._prefill.backlog(r.endpoint)) for r in pool]
            pick = self._strategy.select(views, req)
            entry = next(r for r in pool if r.endpoint == pick.endpoint)
            if entry in closed:
                self._commit(req, entry, uncached, now, use_affinity)
                return (entry, False), reason
            if await self._lease_probe(entry, req):
                self._commit(req, entry, uncached, now, use_affinity)
                return (entry, True), "probe"
            pool = [r for r in pool if r is not entry]
            probing = [r for r in probing if r is not entry]
            if not closed and not probing:
                break
        return None, reason

    def _commit(
        self,
        req: RouteRequest,
        entry: RouteEntry,
        uncached: dict[str, int],
        now: float,
        use_affinity: bool,
    ) -> None:
        if req.dry:
            return
        if use_affinity:
            self._affinity.pin(req.caller, entry.endpoint, now)
            self._pins_changed()
        if self._routing.prefill.enabled:
            self._prefill.acquire(req.request_id, entry.endpoint, uncached[entry.endpoint], now)

    @staticmethod
    def _closed(r: RouteEntry, now: float) -> bool:
        return r.circuit == CLOSED and not r.benched(now)

    @staticmethod
    def _probe_eligible(r: RouteEntry, now: float) -> bool:
        st = r.state
        if st is None or st.circuit_state == CLOSED or r.benched(now):
            return False
        if st.circuit_state == OPEN:
            return (st.open_until or 0) <= now
        return st.circuit_state == HALF_OPEN and not st.probe_in_flight

    async def _lease_probe(self, r: RouteEntry, req: RouteRequest) -> bool:
        """Lease ``r``'s single half-open probe from its owner for ``req``; a dry request
        only asks whether the probe is free (per the circuit view), leasing nothing."""
        if req.dry:
            return True  # _probe_eligible already saw no probe in flight
        try:
            grant = await self.ctx.bus.request(
                subjects.endpoint_probe(r.endpoint),
                ProbeRequest(request_id=req.request_id),
                reply_type=ProbeGrant,
                timeout=_PROBE_LEASE_TIMEOUT,
            )
        except (NoRespondersError, RequestTimeoutError):
            logger.warning("probe lease for %s not answered", r.endpoint)
            return False
        return isinstance(grant, ProbeGrant) and grant.granted

    def _cooling(self, routes: list[RouteEntry], req: RouteRequest, now: float) -> dict[str, float]:
        """The routes among ``routes`` that are cooling for ``req``'s caller, and until when."""
        out: dict[str, float] = {}
        for r in routes:
            until = self._keys.cooling_until(r.endpoint, req.role, now)
            if until is not None:
                out[r.endpoint] = until
        return out
