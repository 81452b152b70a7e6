"""A request's target: the public models that may serve it, in order, and their plans.

``Targeting`` resolves the model field: a plain model id (or alias) is a walk of one; a
steered request (``auto``, ``auto:<axis>``, ``auto:<chain>``) is resolved from the steering
book and, for ``auto``, the first routing rule that matches. It asks each model's owner for
its plan (one bus round trip; a moment without an owner is waited out: ``owner_wait``).

``PlanWalk`` walks the ordered models: the failover loop tries the first model's plan (its
routes, weights, circuits, benches, key pools, affinity — the one bus round trip of the happy
path), then asks the next model for its plan, and so on; the hop cap and the wall-clock
budget count across the whole walk. A model that cannot plan (every circuit open, no route
for the modality or the context, ...) is skipped; when none of them can, the first one's
error is the answer, so the error a client sees is deterministic. A bus failure (no
responder, no reply in time, bus closed) is not skipped: it says the control plane is down,
not that one model cannot plan, and the next model would only wait as long again.

A walk with a ``Budget`` (the live path's; explain's has none) waits rather than answer 503
when what holds a request out is back-pressure: every route cooling after its provider's 429
(or the rest out too: open, benched, at capacity), the earliest reset within the request's
cooling wait. It sleeps until that reset (a timer on the event loop's clock, no polling) and
walks again from the first model.

Each plan a walk returns names its model (``RoutePlan.model``, stamped by the model's owner);
the failover loop carries it into each attempt, so nothing about the request changes behind
the loop's back while it walks.

``Targets`` resolves a planned candidate into the ``UpstreamTarget`` an attempt is sent to, its
secret from the config or, for keys added at runtime, from a ``SecretSource``; after a
reload, ``FallbackTargets`` still resolves what requests planned before it name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import anyio

from bus import BusClosedError
from gateway.adapters.base import UpstreamTarget
from gateway.auth.admin_access import is_admin
from gateway.auth.gate import caller_of, may_call
from gateway.formats.openai_chat import route_needs
from gateway.http.request import bounded, header_text
from gateway.ingress.owner_wait import OwnerWait
from gateway.ingress.route_batch import route_asker
from gateway.steering.labels import conversation_key
from gateway.steering.resolver import Steerer, is_steering
from schemas import (
    AllRoutesCoolingError,
    BusTimeoutError,
    GatewayError,
    NoRespondersError,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    raise_for_reply,
    subjects,
)
from schemas.config import RouteConfig

if TYPE_CHECKING:
    import random

    from bus import Bus
    from gateway.adapters.base import JSON
    from gateway.auth.provider_secrets import ProviderSecrets
    from gateway.http.request import HttpRequest
    from gateway.ingress.accounting import RequestRecord
    from gateway.ingress.dispatch import Budget
    from gateway.ingress.request_info import RequestInfo
    from gateway.steering.resolver import Resolution
    from gateway.steering.rules import RulesView
    from gateway.steering.view import SteeringView
    from schemas import RouteCandidate
    from schemas.config import GatewayConfig, ModelConfig
    from schemas.pricing import Pricing

Ask = Callable[["ModelConfig"], Awaitable["RoutePlan"]]

_CONTROL_PLANE_DOWN = (BusTimeoutError, NoRespondersError, BusClosedError)


def models_by_name(config: GatewayConfig) -> dict[str, ModelConfig]:
    """Every model of ``config`` under its id and each of its aliases."""
    return {name: m for m in config.models for name in (m.id, *m.aliases)}


class Targeting:
    """Resolves model fields against the config it serves (replaced on reload) and asks
    models' owners for plans. Raises what resolution and planning raise (see the methods)."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        *,
        secrets: ProviderSecrets,
        steering: SteeringView,
        rules: RulesView,
        lease_holder: str,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        """``clock`` (monotonic seconds) ages affinity pins; ``rng`` draws exploration."""
        self._bus = bus
        self._ask_route = route_asker(bus)
        self._owners = OwnerWait(bus)
        self._secrets = secrets
        self._steering = steering
        self._rules = rules
        self._holder = lease_holder
        self._steerer = Steerer(
            affinity=config.routing.affinity.enabled,
            ttl=config.routing.affinity.ttl_seconds,
            clock=clock,
            rng=rng,
        )
        self.reconfigure(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Resolve against ``config`` from the next request on."""
        self._config = config
        self.models = models_by_name(config)
        # Built once per model, not per request.
        self._subjects = {m.id: subjects.model_route(m.id) for m in config.models}

    def resolve(
        self, name: str, req: HttpRequest, record: RequestRecord | None = None
    ) -> ModelConfig:
        """The model ``name`` (an id or alias) names for ``req``'s caller. Raises
        RouteNotFoundError for an unknown, unpublished or forbidden model."""
        if record is not None:
            record.requested(name)
        model = self.models.get(name)
        # A model above the caller's role is "not found": its existence is not revealed.
        if model is None or not model.published or not may_call(req, model):
            quoted = bounded(name)  # a client's megabyte is not echoed back
            raise RouteNotFoundError(f"the model {quoted!r} does not exist")
        return model

    async def walk(
        self,
        requested: str,
        req: HttpRequest,
        info: RequestInfo,
        ask: Ask,
        *,
        explore: bool = True,
        body: JSON | None = None,
    ) -> PlanWalk:
        """The models that may serve ``requested``, in order (the live path's, and explain's);
        for ``auto``, the first routing rule matching ``body`` picks the target. Raises
        RouteNotFoundError (a plain model) or InvalidRequestError (an unknown or empty
        chain)."""
        # A model id or alias is never a steering name (the config refuses ``auto…`` ones).
        if requested in self.models or not is_steering(requested):
            return PlanWalk((self.resolve(requested, req, info.record),), ask)
        info.record.requested(requested)
        caller = caller_of(req)
        book = await self._steering.book_for(requested)
        rule = (
            self._rules.for_request(body, req, info, book, caller.org)
            if body is not None and self._rules.applies(requested)
            else None
        )
        steered = self._steerer.resolve(
            book,
            rule.route if rule else requested,
            org=caller.org,
            role=caller.role,
            caller=info.caller,
            conversation=conversation_key(body),
            explore=explore,
        )
        if rule is not None:
            steered = dataclasses.replace(steered, rule=rule.name)
        info.record.steered(steered)
        models = tuple(m for m in map(book.model, steered.models) if m is not None)
        return PlanWalk(models, ask, steered)

    def served(self, walk: PlanWalk, model: str, requested: str) -> str:
        """The model id the answer shows: the one asked for, or for a steered request the
        public model that served it, ``model`` (which the caller stays on while it is
        healthy)."""
        if walk.steered is None:
            return requested
        self._steerer.served(walk.steered, model)
        return model

    def plan_for(
        self,
        model: ModelConfig,
        body: JSON,
        surface: str,
        req: HttpRequest,
        info: RequestInfo,
        *,
        dry: bool = False,
    ) -> Awaitable[RoutePlan]:
        """Ask ``model``'s owner for its plan for this request (``dry``: explain's, which
        takes no lease and pins nothing). Raises what the owner's error reply carries."""
        if surface == "embeddings":
            route_req = RouteRequest(
                model=model.id,
                caller=info.caller,
                # Its input is all it takes of a token limit: an embedding has no output.
                prompt_tokens=info.prompt_estimate,
                output_cap=0,
                surface=surface,
                request_id=info.request_id,
                role=info.role,
                dry=dry,
                lease_holder=self._holder,
            )
        else:
            modalities, cap, thinking = route_needs(body)
            route_req = RouteRequest(
                model=model.id,
                caller=info.caller,
                modalities=modalities,
                prompt_tokens=info.prompt_estimate,
                output_cap=cap,
                thinking_budget=thinking,
                pin=self._pin(req),
                surface=surface,
                request_id=info.request_id,
                role=info.role,
                dry=dry,
                lease_holder=self._holder,
            )
        return self._plan(model, route_req, info.record)

    def _pin(self, req: HttpRequest) -> str | None:
        """``X-Route-Pin`` counts only from an admin caller (an admin debugging aid). An
        endpoint id is UTF-8 (``X-Routed-Via`` names it so): so is the pin."""
        pin = req.headers.get("x-route-pin")
        return header_text(pin) if pin and is_admin(req, self._config) else None

    async def _plan(
        self, model: ModelConfig, route_req: RouteRequest, record: RequestRecord
    ) -> RoutePlan:
        record.routing(route_req)
        subject = self._subjects.get(model.id) or subjects.model_route(model.id)
        timeout = self._config.routing.decision_timeout_seconds
        try:
            reply = await self._ask_route(subject, route_req, timeout=timeout)
        except NoRespondersError:  # its owner restarting or moving: wait a moment for it
            reply = await self._owners.ask_again(subject, route_req, timeout)
        if self._owners.gone:
            self._owners.answered(subject)
        plan = reply if isinstance(reply, RoutePlan) else raise_for_reply(reply)
        if any(c.credential_id or c.spare_credentials for c in plan.candidates):
            await self._secrets.ensure(plan)  # a keyless plan (local servers) needs no grant
        return record.routed(plan)


class PlanWalk:
    """Owns the position of one request in its ordered models."""

    __slots__ = ("_ask", "_models", "_next", "budget", "budget_for", "on_wait", "steered")

    def __init__(
        self,
        models: Sequence[ModelConfig],
        ask: Ask,
        steered: Resolution | None = None,
        budget: Budget | None = None,
    ) -> None:
        self._models = models
        self._ask = ask
        self._next = 0
        self.steered = steered
        self.budget = budget
        # The live path's: makes the request's budget when the walk first needs one (the
        # happy path never does: the failover loop makes it), so it may wait for cooling.
        self.budget_for: Callable[[], Budget] | None = None
        # Called as a wait for a cooling route begins (the live path's: its client's
        # disconnect is heard during the wait, which nothing else would end early).
        self.on_wait: Callable[[], None] | None = None

    @property
    def has_more(self) -> bool:
        """Whether another model may still be asked for a plan."""
        return self._next < len(self._models)

    async def first(self) -> RoutePlan:
        """The first plan any model makes (once a cooling route is back, when that is what
        holds the request out and the budget lets it wait). Raises the first model's
        GatewayError when none can plan."""
        plan, errors = await self._first_of_all()
        while plan is None:
            if not await self._waited(errors):
                raise errors[0]
            # Shielded as after_cooling's: a plan arrives with a lease, and the client may go
            # now (the wait set its disconnect watch listening: ``on_wait``).
            with anyio.CancelScope(shield=True):
                plan, errors = await self._first_of_all()
        return plan

    async def after_cooling(self) -> RoutePlan | None:
        """Walk again from the first model, every attempt so far having met a 429: the
        first plan, asked at once (routes the attempts did not reach may be free) and then
        each time the earliest cooling route is back, while the budget lets the request
        wait; None when it does not, or no model can plan for another reason."""
        while True:
            self._next = 0
            # Shielded as the loop's own plan requests: a plan arrives with a lease.
            with anyio.CancelScope(shield=True):
                try:
                    plan, errors = await self._first_of_all()
                except GatewayError:
                    return None  # the control plane is down: the attempts' errors stand
            if plan is not None:
                return plan
            if not await self._waited(errors):
                return None

    async def _first_of_all(self) -> tuple[RoutePlan | None, list[GatewayError]]:
        """The first plan a model makes from the walk's position, with the errors of the
        models before it that could not plan. Raises a bus failure."""
        errors: list[GatewayError] = []
        while self.has_more:
            try:
                return await self._take(), errors
            except _CONTROL_PLANE_DOWN:
                raise
            except GatewayError as err:
                errors.append(err)
        return None, errors

    async def _waited(self, errors: list[GatewayError]) -> bool:
        """Sleep until the first route of the models that are cooling is back, and rewind
        the walk, when the budget lets the request wait that long; False when it does not
        (or no model was held out by cooling)."""
        waits = [e.retry_after for e in errors if isinstance(e, AllRoutesCoolingError)]
        known = [w for w in waits if w is not None]
        if self.budget is None and self.budget_for is not None:
            self.budget = self.budget_for()
        wait = self.budget.cooling_wait(min(known)) if known and self.budget else None
        if wait is None:
            return False
        if self.on_wait is not None:
            self.on_wait()
        await anyio.sleep(wait)
        self._next = 0
        return True

    async def next(self) -> RoutePlan | None:
        """The next model's plan (skipping models that cannot plan); None when none is left."""
        while self.has_more:
            try:
                return await self._take()
            except GatewayError as err:
                if not self._skippable(err):
                    raise
        return None

    async def _take(self) -> RoutePlan:
        model = self._models[self._next]
        self._next += 1
        return await self._ask(model)

    def _skippable(self, err: GatewayError) -> bool:
        """A walk of several models skips one that cannot plan (a walk of one has nothing
        to skip to, so its error is the answer at once); a bus failure is never skipped."""
        return len(self._models) > 1 and not isinstance(err, _CONTROL_PLANE_DOWN)


# ---------------------------------------------------------------------- an attempt's target


_DEFAULT_ROUTE = RouteConfig(kind="echo")
_RESOLVED_MAX = 4096


class SecretSource(Protocol):
    """Where secrets of credentials the config does not hold come from (database keys:
    ``gateway.auth.provider_secrets.ProviderSecrets``, which the app passes in)."""

    def get(self, cid: str) -> str | None:
        """The secret of credential ``cid``; None when this source has none."""
        ...


class _NoSecrets:
    def get(self, cid: str) -> str | None:
        return None


NO_SECRETS: SecretSource = _NoSecrets()


class Targets:
    """Resolves a plan's candidate into an UpstreamTarget, secret included: from the config,
    else from ``runtime`` (the secrets of keys added at runtime)."""

    def __init__(self, config: GatewayConfig, runtime: SecretSource = NO_SECRETS) -> None:
        self._runtime = runtime
        self._routes: dict[str, RouteConfig] = {}
        self.prices: dict[str, Pricing | None] = {}
        """Each endpoint's route's ``pricing:`` (None: unpriced; absent: unknown)."""
        self._secrets: dict[str, str] = {}
        # Made once per (route, secret): a frozen dataclass costs microseconds to build.
        self._resolved: dict[tuple[str, str, str, str, str | None], UpstreamTarget] = {}
        for model in config.models:
            for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
                self._routes[eid] = route
                self.prices[eid] = route.pricing
                for cid, secret in zip(route.credential_ids, route.secrets, strict=True):
                    self._secrets[cid] = secret

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        """The target for candidate ``c`` (unknown endpoints get default timeouts); the same
        object for the same route and secret (a target is immutable)."""
        api_key = (
            self._secrets.get(c.credential_id) or self._runtime.get(c.credential_id)
            if c.credential_id
            else None
        )
        key = (c.endpoint, c.kind, c.base_url, c.upstream_model, api_key)
        target = self._resolved.get(key)
        if target is None:
            target = self._target(c, api_key)
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[key] = target
        return target

    def _target(self, c: RouteCandidate, api_key: str | None) -> UpstreamTarget:
        route = self._routes.get(c.endpoint, _DEFAULT_ROUTE)
        return UpstreamTarget(
            endpoint=c.endpoint,
            kind=c.kind,
            base_url=c.base_url,
            upstream_model=c.upstream_model,
            api_key=api_key,
            timeout=route.timeout_seconds,
            connect_timeout=route.connect_timeout_seconds,
            ttft_timeout=route.ttft_timeout_seconds,
            idle_timeout=route.idle_timeout_seconds,
            azure=route.azure,
            bedrock=route.bedrock,
        )


class FallbackTargets(Targets):
    """Targets of the new config that still resolve, from the previous one, the endpoints
    and credentials a reload removed (for requests planned before the swap)."""

    def __init__(
        self, config: GatewayConfig, previous: Targets, runtime: SecretSource = NO_SECRETS
    ) -> None:
        super().__init__(config, runtime)
        self._known = {e for m in config.models for e in m.endpoint_ids()}
        self._previous = previous
        # A route's pricing from the new config, unless a reload removed the endpoint.
        self.prices = {**previous.prices, **self.prices}

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        """The target for ``c``: from the new config, unless it lost the endpoint or key."""
        if c.endpoint not in self._known:
            return self._previous.resolve(c)
        target = super().resolve(c)
        if c.credential_id and target.api_key is None:
            return self._previous.resolve(c)
        return target
