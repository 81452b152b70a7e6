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
context window -> weight and circuit admission -> session affinity -> prefill-aware draw. The
decision itself is the planner's (actors/state/planner.py, a function of these views, the
request and the clock); this actor takes the leases it asks for and records what it chose.
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
from actors.state.cooling import CooledRoutes
from actors.state.planner import Decision, RoutePlanner, serving
from actors.state.prefill import PrefillLoad
from actors.state.quota import KeyQuota, KeyUsage
from actors.state.route_table import RouteEntry, RouteTable
from actors.strategies import (
    ProbeTick,
    RoutingStrategy,
    StrategyDeps,
    build_strategy,
    strategy_serves,
)
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import (
    CapacityState,
    EndpointState,
    ErrorCode,
    ErrorReply,
    FirstToken,
    GatewayError,
    KeyPoolState,
    LocalHealth,
    ModeChanged,
    ModelBreakerTripped,
    ModelStatus,
    ModelStatusRequest,
    ModeRequest,
    Observation,
    ProbeGrant,
    ProbeRequest,
    RouteBatch,
    RouteBatchReply,
    RoutePlan,
    RouteRequest,
    SetWeight,
    StateRequest,
    is_backpressure,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from schemas.config import ModelConfig, RoutingConfig
    from schemas.routing import RateReport

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
            *strategy_serves(self._router, model),
        )

    # -- lifecycle ----------------------------------------------------------------------

    async def on_start(self, ctx: ActorContext) -> None:
        """Build routes, strategy and tables; restore the snapshot; seed the circuit view."""
        self.ctx = ctx
        self._table = RouteTable(self._model, self._routing, fixed=self._router == "fixed")
        self._load = ModelLoad(self._model, self._routing, self._clock, keys_of=self._key_ids)
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
        self._flush_scheduled = False
        self._streak = 0
        self._cooled = CooledRoutes()  # routes a 429 took out of rotation, until their reset
        self._keys = KeyViews(self._model, self._routing.key_pool)
        if self._load.pacing:
            self._keys.follow_paces(self._load.key_spent)
        await self._keys.seed(ctx.bus)
        self._quota = KeyQuota(
            {cid: a for r in self._model.route for cid, a in r.allowances.items()}
        )
        await self._restore()
        self._prefer_by_quota()
        self._host = self._strategy.host(self._model, self._clock)
        spills = self._router == "fixed" and self._routing.learned_capacity.enabled
        self._planner = RoutePlanner(
            self._model,
            self._routing,
            table=self._table,
            keys=self._keys,
            cooled=self._cooled,
            affinity=self._affinity,
            prefill=self._prefill,
            load=self._load,
            strategy=self._strategy,
            host=self._host,
            router=self._router,
            # Spilling is the fixed router's (RouteWise and round_robin keep their own order);
            # RouteWise too leaves out a route a request's tokens would overdraw (a baseline
            # or round_robin sends it on, as their request limits).
            spills=spills,
            spills_for_tokens=spills or self._router == "routewise",
            pins_changed=self._pins_changed,
        )
        if self._host is not None:
            await self._host.start(ctx)
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
            self._planner.degraded = mode.mode == "degraded"

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
            case RouteBatch() as batch:
                await env.respond(
                    RouteBatchReply(replies=tuple([await self._answer(r) for r in batch.requests]))
                )
            case Observation() as obs:
                self._observed(obs)
            case FirstToken() as ft:
                self._prefill.release(ft.request_id)
                if ft.unsent:
                    self._load.unsent(ft.request_id, ft.endpoint)
                if ft.spent_for is not None:
                    self._load.spent(ft.endpoint, ft.spent_for)
                if ft.rate is not None:
                    self._rate_reported(ft.endpoint, ft.credential_id, ft.request_id, ft.rate)
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
                self._load.keys_changed(ks.pool)
            case CapacityState() as cs:
                self.capacity.update(cs)
            case other if self._host is not None and self._host.feed(other):
                if env.reply is not None:  # the settings hand-over waits until applied
                    await env.respond(self.status())
            case ModeChanged() as mode:
                self._planner.degraded = mode.mode == "degraded"
            case ModelStatusRequest():
                await env.respond(self.status())

    async def handle_local(self, msg: object) -> None:
        """Timers: flush the snapshot; the RouteWise probe round."""
        if isinstance(msg, _FlushSnapshot):
            self._flush_scheduled = False
            await self._save()
        elif isinstance(msg, ProbeTick) and self._host is not None:
            now = self._clock()
            await self._host.probe_round(
                self.ctx,
                {
                    r.endpoint: r.candidate
                    for r in self._table.published()
                    if r.weight > 0 and serving(r, now)
                },
            )

    def _rate_reported(self, endpoint: str, key: str, request_id: str, rate: RateReport) -> None:
        if self._load.pacing:
            self._load.reported(endpoint, key, request_id, rate)
        else:  # unpaced, a spent limit still spends it until all of it is back
            for limit in (rate, rate.tokens, rate.output_tokens):
                if limit is not None and limit.remaining == 0:
                    self._load.spent(endpoint, limit.reset_seconds)

    def _key_ids(self, endpoint: str) -> tuple[str, ...]:
        """The credential ids ``endpoint``'s pool declares (none: a route without keys)."""
        pool = self._keys.pool(endpoint)
        return () if pool is None else tuple(cid for cid, _ in pool.declared)

    def _prefer_by_quota(self) -> None:
        """``credential_choice: least_remaining_quota``: the pools spend first the key with
        the least free allowance left (independent of steering's model ranking)."""
        if self._model.credential_choice == "least_remaining_quota":
            self._keys.prefer(self._quota.preference(self._clock()))

    def _observed(self, obs: Observation) -> None:
        now = self._clock()
        if obs.rate is not None:  # before the observation ends the request's count
            self._rate_reported(obs.endpoint, obs.credential_id, obs.request_id, obs.rate)
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
        if self._streak >= limit and now >= self._planner.tripped_until:
            self._planner.tripped_until = now + self._routing.circuit.cooldown_seconds
            self._streak = 0
            logger.warning(
                "model %s breaker tripped after %d consecutive failures", self._model.id, limit
            )
            self.ctx.start_soon(
                lambda: self.ctx.publish(
                    subjects.event("model_breaker"),
                    ModelBreakerTripped(
                        model=self._model.id,
                        failures=limit,
                        until=self._planner.tripped_until,
                        ts=now,
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
        if self._host is None:
            return st
        live = [
            r.view(self._prefill.backlog(r.endpoint))
            for r in self._table.published()
            if r.weight > 0 and serving(r, now)
        ]
        tokens = self._host.prompt_tokens
        rows = self._host.rows(live, RouteRequest(model=self._model.id, prompt_tokens=tokens))
        return msgspec.structs.replace(st, routewise=rows, routewise_prompt_tokens=tokens)

    # -- the decision -------------------------------------------------------------------

    async def plan(self, req: RouteRequest) -> RoutePlan:
        """Decide which routes serve ``req``, primary first, with the primary's capacity lease
        taken (actors/capacity_view.py). Raises GatewayError subclasses."""
        plan = await self.capacity.decide(req, self._decide, self.ctx.bus, self._clock())
        if not req.dry:
            self._load.issued(req.request_id, plan, self._clock(), req)
        return plan

    async def _answer(self, req: RouteRequest) -> RoutePlan | ErrorReply:
        """One request of a RouteBatch: its plan, or the error it alone met."""
        try:
            return await self.plan(req)
        except GatewayError as err:
            return err.to_reply()

    async def _decide(self, req: RouteRequest, full: frozenset[str]) -> RoutePlan:
        """The planner's plan for ``req`` without the capacity routes in ``full``: this
        takes the probe leases it asks for and records the primary's pin and prefill."""
        now = self._clock()
        planning = self._planner.decide(req, full, now)
        try:
            step = next(planning)
            while True:
                step = planning.send(await self._lease_probe(step.entry, req))
        except StopIteration as done:
            decision: Decision = done.value
        if decision.pin is not None:
            self._affinity.pin(decision.pin, decision.primary, now)
            self._pins_changed()
        if decision.prefill is not None:
            self._prefill.acquire(req.request_id, decision.primary, decision.prefill, now)
        return decision.plan

    async def _lease_probe(self, r: RouteEntry, req: RouteRequest) -> bool:
        """Lease ``r``'s single half-open probe from its owner for ``req``."""
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
