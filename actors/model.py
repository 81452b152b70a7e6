"""ModelActor: owns one public model's routing decisions.

It keeps a view of its endpoints' states (fed by their state events), hosts the model's
strategy, and answers every RouteRequest with a RoutePlan: the primary the strategy picked,
then the other admissible routes in declaration order. The only thing it asks an owner for at
decision time is the scarce half-open probe lease.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from actors.base import Actor, ActorContext, Serve
from actors.health import CLOSED, HALF_OPEN, OPEN
from actors.strategies import RouteView, RoutingStrategy, build_strategy
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import (
    AllCircuitsOpenError,
    EndpointState,
    ModelStatus,
    ModelStatusRequest,
    NoRouteForModalityError,
    PinNotFoundError,
    ProbeGrant,
    ProbeRequest,
    RouteCandidate,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    RouteStatus,
    StateRequest,
    subjects,
)
from schemas.config import ModelConfig, RouteConfig

logger = logging.getLogger(__name__)

_PROBE_LEASE_TIMEOUT = 2.0
_UNKNOWN_RECOVERY_SECONDS = 1.0


class _Route:
    """A route as the ModelActor holds it: config, id, effective weight, last known state."""

    __slots__ = ("candidate", "config", "endpoint", "index", "state", "weight")

    def __init__(self, index: int, endpoint: str, config: RouteConfig) -> None:
        self.index = index
        self.endpoint = endpoint
        self.config = config
        self.weight = config.weight
        self.state: EndpointState | None = None
        creds = config.credential_ids
        self.candidate = RouteCandidate(
            endpoint=endpoint,
            kind=config.kind,
            base_url=config.base_url,
            upstream_model=config.provider_model_id,
            credential_id=creds[0] if creds else "",
        )

    @property
    def circuit(self) -> str:
        return self.state.circuit_state if self.state else CLOSED

    def view(self) -> RouteView:
        return RouteView(self.index, self.endpoint, self.weight, self.config)


class ModelActor(Actor):
    """One per public model id. Raises (as ErrorReply) RouteNotFoundError,
    NoRouteForModalityError, PinNotFoundError, AllCircuitsOpenError."""

    def __init__(
        self,
        model: ModelConfig,
        default_router: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = f"model:{model.id}"
        self._model = model
        self._router = model.router or default_router
        self._clock = clock
        ids = model.endpoint_ids()
        self.serves = (
            Serve(subjects.model_route(model.id)),
            Serve(subjects.model_status(model.id)),
            *(Serve(subjects.endpoint_state(e)) for e in ids),
        )
        self._endpoint_ids = ids

    async def on_start(self, ctx: ActorContext) -> None:
        """Build the route table and strategy; seed the view from the endpoints' owners."""
        self.ctx = ctx
        self._routes = [
            _Route(i, e, r)
            for i, (e, r) in enumerate(zip(self._endpoint_ids, self._model.route, strict=True))
        ]
        self._by_endpoint = {r.endpoint: r for r in self._routes}
        self._strategy: RoutingStrategy = build_strategy(self._router, self._model.router_params)
        for r in self._routes:
            try:
                reply = await ctx.bus.request(
                    subjects.endpoint_get(r.endpoint), StateRequest(), reply_type=EndpointState,
                    timeout=1.0,
                )
            except (NoRespondersError, RequestTimeoutError):
                continue
            if isinstance(reply, EndpointState):
                r.state = reply

    async def handle(self, env: Envelope) -> None:
        """Route requests, status requests, endpoint state events."""
        match env.message:
            case RouteRequest() as req:
                await env.respond(await self.plan(req))
            case EndpointState() as st:
                route = self._by_endpoint.get(st.endpoint)
                if route is not None and (route.state is None or st.seq >= route.state.seq):
                    route.state = st
            case ModelStatusRequest():
                await env.respond(self.status())

    def status(self) -> ModelStatus:
        """Routes with effective weights and the circuits this actor sees."""
        return ModelStatus(
            model=self._model.id,
            router=self._router,
            routes=tuple(
                RouteStatus(
                    endpoint=r.endpoint,
                    kind=r.config.kind,
                    weight=r.weight,
                    configured_weight=r.config.weight,
                    circuit_state=r.circuit,
                )
                for r in self._routes
            ),
        )

    async def plan(self, req: RouteRequest) -> RoutePlan:
        """Decide which routes serve ``req``, primary first. Raises GatewayError subclasses."""
        routes = [r for r in self._routes if r.weight > 0 or req.pin]
        if not self._model.published or not routes:
            raise RouteNotFoundError(f"model {self._model.id!r} has no published route")
        if req.modalities:
            needed = set(req.modalities)
            routes = [r for r in routes if needed <= set(r.config.input_modalities)]
            if not routes:
                raise NoRouteForModalityError(
                    f"no route of model {self._model.id!r} accepts input modalities "
                    f"{', '.join(sorted(needed))}"
                )
        if req.pin:
            pinned = self._by_endpoint.get(req.pin)
            if pinned is None or pinned not in routes:
                raise PinNotFoundError(f"X-Route-Pin {req.pin!r} matches no route of this model")
            return RoutePlan(model=self._model.id, candidates=(pinned.candidate,), pinned=True,
                             reason="pin")
        admissible: list[_Route] = []
        probes: dict[str, RouteCandidate] = {}
        now = self._clock()
        for r in routes:
            if r.weight <= 0:
                continue
            if await self._admits(r, now, probes):
                admissible.append(r)
        if not admissible:
            raise AllCircuitsOpenError(
                f"every route of model {self._model.id!r} is unavailable (circuits open)",
                retry_after=self._earliest_recovery(routes, now),
            )
        primary = self._strategy.select([r.view() for r in admissible], req)
        ordered = [self._by_endpoint[primary.endpoint]]
        ordered += [r for r in admissible if r.endpoint != primary.endpoint]
        return RoutePlan(
            model=self._model.id,
            candidates=tuple(probes.get(r.endpoint, r.candidate) for r in ordered),
            reason=self._router,
        )

    async def _admits(self, r: _Route, now: float, probes: dict[str, RouteCandidate]) -> bool:
        state = r.state
        if state is None or state.circuit_state == CLOSED:
            return True
        cooling = state.circuit_state == OPEN and (state.open_until or 0) > now
        if cooling or (state.circuit_state == HALF_OPEN and state.probe_in_flight):
            return False
        try:
            grant = await self.ctx.bus.request(
                subjects.endpoint_probe(r.endpoint),
                ProbeRequest(),
                reply_type=ProbeGrant,
                timeout=_PROBE_LEASE_TIMEOUT,
            )
        except (NoRespondersError, RequestTimeoutError):
            logger.warning("probe lease for %s not answered", r.endpoint)
            return False
        if isinstance(grant, ProbeGrant) and grant.granted:
            probes[r.endpoint] = RouteCandidate(
                endpoint=r.candidate.endpoint,
                kind=r.candidate.kind,
                base_url=r.candidate.base_url,
                upstream_model=r.candidate.upstream_model,
                credential_id=r.candidate.credential_id,
                probe=True,
            )
            return True
        return False

    def _earliest_recovery(self, routes: list[_Route], now: float) -> float:
        waits = [
            max(0.0, r.state.open_until - now)
            for r in routes
            if r.state is not None and r.state.open_until is not None
        ]
        # A half-open endpoint whose probe is out has no open_until: ask again shortly.
        return min(waits) if waits else _UNKNOWN_RECOVERY_SECONDS
