"""create_app(bus, config): the ingress, a plain ASGI app (server-agnostic, no framework).

Per request: decode and validate in the client's shape, resolve the model, ask the model's
owner for a plan (one bus round trip), run the failover loop, relay the answer (streams
included) and publish one observation per attempt. Errors are answered in the caller's shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from gateway.adapters.echo import EchoAdapter
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.admin import limits as admin_limits
from gateway.admin import routing as admin_routing
from gateway.admin.routewise import RouteWiseAdmin
from gateway.admin.rules import RulesAdmin
from gateway.auth.admin_access import is_admin
from gateway.auth.callers import Callers
from gateway.auth.gate import caller_of, may_call
from gateway.dashboard import Dashboard
from gateway.formats import anthropic_messages
from gateway.formats.openai_chat import estimate_prompt_tokens, input_modalities
from gateway.formats.openai_embeddings import validate_embeddings_request
from gateway.ingress.accounting import RequestRecord, bounded
from gateway.ingress.admission import Admission, Ticket
from gateway.ingress.capacity_health import capacity_lines
from gateway.ingress.clock import SYSTEM_CLOCK, IngressClock
from gateway.ingress.dispatch import Dispatcher
from gateway.ingress.errors import (
    DEFAULT_RETRY_AFTER,
    client_message,
    error_code,
    error_param,
    http_status,
    retry_after_header,
)
from gateway.ingress.identity import affinity_key, conversation_key
from gateway.ingress.leases import LeaseKeeper
from gateway.ingress.operations import IngressOps
from gateway.ingress.plan_walk import Ask, PlanWalk
from gateway.ingress.request import HttpRequest, Receive, Scope, Send
from gateway.ingress.request_info import RequestInfo
from gateway.ingress.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from gateway.ingress.targets import Targets
from gateway.process.reload import FallbackTargets
from gateway.steering import explain
from gateway.steering.labels import client_metadata
from gateway.steering.resolver import Steerer, is_steering
from gateway.steering.rules import RulesView
from gateway.steering.view import SteeringView
from schemas import (
    GatewayError,
    HealthReport,
    HealthRequest,
    InvalidRequestError,
    ModeChanged,
    ModelStatus,
    ModelStatusRequest,
    ModeRequest,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    UnauthorizedError,
    UpstreamError,
    raise_for_reply,
    subjects,
)
from schemas.catalog import AXIS_SYNONYMS, ascii_lower

if TYPE_CHECKING:
    import random
    from collections.abc import Mapping

    from bus import Bus
    from gateway.adapters.base import JSON, Adapter, UpstreamTarget
    from gateway.adapters.upstream_http import UpstreamHTTP
    from gateway.ingress.stream_attempt import StreamAttempt
    from schemas.config import GatewayConfig, ModelConfig

logger = logging.getLogger(__name__)

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_DEGRADED_AVAILABILITY = 0.9
_PROBE_TIMEOUT_S = 1.0  # /health and /health/ready: how long the actors may take to answer
_MODELS_PREFIX = "/v1/models/"
Handler = Callable[[HttpRequest], Awaitable[None]]


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError("the request body is JSON nested too deeply")


class GatewayApp:
    """The ASGI ingress. Owns the upstream HTTP client and the adapters; holds no routing
    state of its own (that lives in the actors)."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        *,
        clock: IngressClock = SYSTEM_CLOCK,
        adapters: Mapping[str, Adapter] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``clock``, ``adapters`` (by upstream kind, in place of the HTTP ones) and ``rng``
        (steering's exploration draws) are the replay's: production leaves them unset."""
        self._bus = bus
        self._config = config
        self._clock = clock
        self._own_adapters = adapters
        self._models: dict[str, ModelConfig] = {}
        for m in config.models:
            for name in (m.id, *m.aliases):
                self._models[name] = m
        self._client: UpstreamHTTP | None = None
        self._adapters: dict[str, Adapter] = {"echo": EchoAdapter(), **(adapters or {})}
        # The models' "created" time: no model has a release date in the config.
        self._loaded_at = int(clock.wall())
        # One holder id per ingress: its capacity leases are renewed and released under it.
        self.leases = LeaseKeeper(
            bus,
            config.routing.leases.ttl_seconds,
            f"ingress-{os.getpid():x}-{secrets.token_hex(3)}",
            max_age=_lease_max_age(config),
            clock=clock.steady,
        )
        # Callers and credentials: the auth gate and the grants of database keys' secrets,
        # which the targets read (passed in, never a module global).
        self.callers = Callers(bus, config)
        self._dispatcher = Dispatcher(
            bus,
            self._adapters,
            Targets(config, self.callers.secrets),
            config.routing.failover,
            self.leases,
            clock=clock.steady,
            wall=clock.wall,
        )
        self._ids = itertools.count(1)
        self.steering = SteeringView(bus, config)
        self._steerer = Steerer(
            affinity=config.routing.affinity.enabled,
            ttl=config.routing.affinity.ttl_seconds,
            clock=clock.steady,
            rng=rng,
        )
        self._pid = os.getpid()
        self._id_prefix = f"{self._pid:x}-"
        self._surfaces = {
            "/v1/chat/completions": CHAT,
            "/v1/embeddings": CHAT,
            "/v1/responses": RESPONSES,
            "/v1/messages": MESSAGES,
        }
        # The routing rule set: this ingress's compiled view, and its admin routes.
        self.rules = RulesView(bus)
        self._rules_admin = RulesAdmin(bus, config)
        # RouteWise settings: thin clients of the admin area ``routewise``.
        self._routewise_admin = RouteWiseAdmin(bus, config)
        # Accounting, /metrics, /events, the /admin/<area>/<verb> API.
        self.ops = IngressOps(bus, config)
        self.ops.after_admin.update(chains=self.steering.refresh, steering=self.steering.refresh)
        # Callers' rate limits and budgets: asked of their owner beside the routing request.
        self.admission = Admission(bus, config)
        self.ops.after_admin["limits"] = self.admission.refresh
        # The operator dashboard: its API is the admin routes of the table, reached with a
        # session.
        self.dashboard = Dashboard(bus, config, self.callers.auth, self._admin_route)
        self._routes, self._prefix_routes = self._route_table()

    def _route_table(self) -> tuple[dict[tuple[str, str], Handler], dict[tuple[str, str], Handler]]:
        """Every route of the ingress, assembled here only: (exact ``(method, path)`` routes,
        ``(method, prefix)`` routes for paths carrying an id, tried in this order after the
        exact ones). The inference routes are wrapped with accounting; counting tokens routes
        nothing, so it makes no request-log row."""
        accounted = self.ops.accounting.wrap
        exact: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): accounted(self._chat, "chat"),
            ("POST", "/v1/responses"): accounted(self._responses, "responses"),
            ("POST", "/v1/messages"): accounted(self._messages, "messages"),
            ("POST", "/v1/embeddings"): accounted(self._embeddings, "embeddings"),
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("GET", "/v1/models"): self._list_models,
            ("GET", "/health"): self._health,
            ("GET", "/health/ready"): self._ready,
            ("GET", "/health/deep"): self._health_deep,
            ("GET", "/routing"): self._routing,
            ("POST", explain.PATH): self._explain,
            ("GET", admin_limits.PATH): self._admin_limits,
            **self._rules_admin.routes(),
            **self._routewise_admin.routes(),
            **self.callers.routes(),  # /admin/keys, /admin/provider-keys
            **self.ops.routes(),  # /metrics, /events
        }
        prefix: dict[tuple[str, str], Handler] = {
            ("GET", _MODELS_PREFIX): self._retrieve_model,
            ("PUT", admin_routing.PREFIX): self._admin_weights,
            ("DELETE", admin_routing.PREFIX): self._admin_weights,
            # /admin/limits/<kind>/<id> (and the generic /admin/limits/<verb>)
            **{
                (method, admin_limits.PREFIX): self._admin_limits
                for method in ("GET", "PUT", "DELETE", "POST")
            },
            **self.callers.prefix_routes(),  # /admin/keys/<id>/..., /admin/provider-keys/<id>
            **self._routewise_admin.prefix_routes(),  # /admin/routewise/model-settings/<key>
            **self.dashboard.prefix_routes(),  # /dashboard...
            **self.ops.prefix_routes(),  # last: the /admin/<area>/<verb> catch-all
        }
        return exact, prefix

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(
                HttpRequest(
                    scope,
                    receive,
                    send,
                    self._config.server.body_timeout_seconds,
                    request_id=f"{self._id_prefix}{next(self._ids)}",
                )
            )
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self._ensure_client()
                await self.callers.start()
                await self.steering.start()
                await self.rules.start()
                await self.dashboard.start()
                await self.admission.start()
                self.ops.start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _ensure_client(self) -> None:
        if self._client is None and self._own_adapters is None:
            self._client = make_http_client()
            self._adapters.update(make_adapters(self._client))

    async def aclose(self) -> None:
        """Close the upstream HTTP client; deliver the request-log rows kept; stop following
        callers' events, sessions' ends, limits' state and renewing leases."""
        await self.ops.aclose()
        await self.admission.aclose()
        await self.dashboard.aclose()
        await self.leases.aclose()
        await self.steering.aclose()
        await self.rules.aclose()
        await self.callers.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def reconfigure(self, config: GatewayConfig) -> None:
        """Serve ``config`` from the next request on (config reload). Requests in flight keep
        the model and plan they started with; their targets still resolve."""
        models = {name: m for m in config.models for name in (m.id, *m.aliases)}
        dispatcher = Dispatcher(
            self._bus,
            self._adapters,
            FallbackTargets(
                config, Targets(self._config, self.callers.secrets), self.callers.secrets
            ),
            config.routing.failover,
            self.leases,
            clock=self._clock.steady,
            wall=self._clock.wall,
        )
        self._config, self._models, self._dispatcher = config, models, dispatcher
        self.leases.retune(config.routing.leases.ttl_seconds, _lease_max_age(config))
        self.ops.reconfigure(config)
        self.callers.reconfigure(config)
        self.steering.reconfigure(config)
        self._rules_admin.config = config
        self.dashboard.reconfigure(config)
        self.admission.reconfigure(config)

    async def _http(self, req: HttpRequest) -> None:
        handler = self._routes.get((req.method, req.path)) or self._prefix_handler(req)
        surface = self._surface_of(req.path)
        try:
            if handler is None:
                if any(path == req.path for _, path in self._routes) or any(
                    req.path.startswith(prefix) for _, prefix in self._prefix_routes
                ):
                    await self._send_error(
                        req, surface, 405, "method not allowed", "invalid_request"
                    )
                else:
                    await self._send_error(
                        req, surface, 404, f"no such path {req.path}", "not_found"
                    )
                return
            await self.callers.gate(req)
            await handler(req)
        except GatewayError as err:
            if not req.started:
                await self._send_gateway_error(req, surface, err)
        except Exception:
            logger.exception("unhandled error serving %s %s", req.method, req.path)
            if not req.started:
                await self._send_error(req, surface, 500, "internal gateway error", "internal")

    def _surface_of(self, path: str) -> Surface:
        """The API shape errors on ``path`` answer in."""
        surface = self._surfaces.get(path)
        if surface is None:
            # Anything under /v1/messages/ (count_tokens, batches, a typo) is Anthropic's.
            surface = MESSAGES if path.startswith("/v1/messages/") else CHAT
        return surface

    async def _admin_route(self, req: HttpRequest) -> None:
        """Serve ``req`` with the handler its (admin) path has; the dashboard's API. Raises
        RouteNotFoundError for a path no route serves."""
        handler = self._routes.get((req.method, req.path)) or self._prefix_handler(req)
        if handler is None or req.path.startswith("/dashboard"):
            raise RouteNotFoundError(f"no such path {req.path}")
        await handler(req)

    def _prefix_handler(self, req: HttpRequest) -> Handler | None:
        for (method, prefix), handler in self._prefix_routes.items():
            if method == req.method and req.path.startswith(prefix):
                return handler
        return None

    async def _send_gateway_error(
        self, req: HttpRequest, surface: Surface, err: GatewayError
    ) -> None:
        status = http_status(err)
        headers = [(b"x-request-id", req.request_id.encode())]
        retry = retry_after_header(err)
        if retry is not None:
            headers.append((b"retry-after", retry))
        await req.respond(
            status,
            surface.error_body(status, client_message(err), error_code(err), error_param(err)),
            headers,
        )

    async def _send_error(
        self, req: HttpRequest, surface: Surface, status: int, message: str, code: str
    ) -> None:
        await req.respond(
            status,
            surface.error_body(status, message, code, None),
            [(b"x-request-id", req.request_id.encode())],
        )

    # -- inference ----------------------------------------------------------------------

    async def _read_json(self, req: HttpRequest) -> Any:
        raw = await req.body(self._config.server.max_body_bytes)
        try:
            return _decode(raw), len(raw)
        except msgspec.DecodeError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        except RecursionError:  # nested past the stack: costs nothing until it happens
            raise _too_deep() from None

    def _resolve(
        self, name: str, req: HttpRequest, record: RequestRecord | None = None
    ) -> ModelConfig:
        if record is not None:
            record.requested(name)
        model = self._models.get(name)
        # A model above the caller's role is "not found": its existence is not revealed.
        if model is None or not model.published or not may_call(req, model):
            quoted = bounded(name)  # a client's megabyte is not echoed back
            raise RouteNotFoundError(f"the model {quoted!r} does not exist")
        return model

    def _pin(self, req: HttpRequest) -> str | None:
        """``X-Route-Pin`` counts only from an admin caller (an admin debugging aid)."""
        pin = req.header("x-route-pin")
        return pin if pin and is_admin(req, self._config) else None

    async def _plan(
        self, model: ModelConfig, route_req: RouteRequest, record: RequestRecord
    ) -> RoutePlan:
        record.routing(route_req)
        reply = await self._bus.request(
            subjects.model_route(model.id),
            route_req,
            reply_type=RoutePlan,
            timeout=self._config.routing.decision_timeout_seconds,
        )
        plan = raise_for_reply(reply)
        await self.callers.secrets.ensure(plan)
        return record.routed(plan)

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
        RouteNotFoundError (a plain model) or InvalidRequestError (an unknown or empty chain)."""
        budget = self._dispatcher.budget(info)  # lets the walk wait for a cooling route
        if not is_steering(requested):
            return PlanWalk((self._resolve(requested, req, info.record),), ask, info, None, budget)
        info.record.requested(requested)
        caller = caller_of(req)
        book = await self.steering.book_for(requested)
        rule = (
            self.rules.for_request(body, req, info, book, caller.org)
            if body is not None and self.rules.applies(requested)
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
        return PlanWalk(models, ask, info, steered, budget)

    def _served(self, walk: PlanWalk, info: RequestInfo, requested: str) -> str:
        """The model id the answer shows: the one asked for, or for a steered request the
        public model that served it (which the caller stays on while it is healthy)."""
        if walk.steered is None:
            return requested
        self._steerer.served(walk.steered, info.model)
        return info.model

    def _plan_for(
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
        takes no lease and pins nothing)."""
        if surface == "embeddings":
            return self._plan(
                model,
                RouteRequest(
                    model=model.id,
                    caller=info.caller,
                    surface=surface,
                    request_id=info.request_id,
                    role=info.role,
                    dry=dry,
                    lease_holder=self.leases.holder,
                ),
                info.record,
            )
        return self._plan(
            model,
            RouteRequest(
                model=model.id,
                caller=info.caller,
                modalities=input_modalities(body),
                prompt_tokens=info.prompt_estimate,
                pin=self._pin(req),
                surface=surface,
                request_id=info.request_id,
                role=info.role,
                dry=dry,
                lease_holder=self.leases.holder,
            ),
            info.record,
        )

    def request_info(self, req: HttpRequest, surface: str, stream: bool) -> RequestInfo:
        """A new request's identity (explain uses the live path's)."""
        return self._info(req, surface, stream)

    def _info(
        self,
        req: HttpRequest,
        surface: str,
        stream: bool,
        prompt_estimate: int = 0,
        record: RequestRecord | None = None,
    ) -> RequestInfo:
        return RequestInfo(
            request_id=req.request_id,
            model="",
            surface=surface,
            stream=stream,
            caller=affinity_key(
                req,
                key_hash=caller_of(req).key_hash,
                trust_proxy_headers=self._config.routing.trust_proxy_headers,
            ),
            prompt_estimate=prompt_estimate,
            started=self._clock.steady(),
            role=caller_of(req).role,
            record=record if record is not None else RequestRecord(),
        )

    async def _chat(self, req: HttpRequest, record: RequestRecord) -> None:
        await self._inference(req, CHAT, record)

    async def _responses(self, req: HttpRequest, record: RequestRecord) -> None:
        await self._inference(req, RESPONSES, record)

    async def _messages(self, req: HttpRequest, record: RequestRecord) -> None:
        await self._inference(req, MESSAGES, record)

    async def _inference(self, req: HttpRequest, surface: Surface, record: RequestRecord) -> None:
        raw, size = await self._read_json(req)
        body = surface.to_canonical(raw)
        client_metadata(req)  # refused early, whatever the model
        requested = str(body["model"])
        stream = bool(body.get("stream"))
        info = self._info(req, surface.name, stream, estimate_prompt_tokens(size), record)

        def ask(model: ModelConfig) -> Awaitable[RoutePlan]:
            return self._plan_for(model, body, surface.name, req, info)

        ticket = self._admission(req, info, requested, body, info.prompt_estimate)
        try:
            walk = await self.walk(requested, req, info, ask, body=body)
            plan = await walk.first()
            await self._admitted(ticket, info, plan)
            await self._until_disconnect(
                req,
                self._serve_stream if stream else self._serve_once,
                req,
                surface,
                info,
                plan,
                body,
                requested,
                raw,
                walk,
            )
        finally:
            if ticket is not None:
                await ticket.finish()

    def _admission(
        self,
        req: HttpRequest,
        info: RequestInfo,
        requested: str,
        body: JSON | None,
        prompt_tokens: int,
    ) -> Ticket | None:
        """Ask the limits' owner now (answered while the routing request runs); None when
        the caller has no limits."""
        ticket = self.admission.begin(
            req, caller_of(req), info.request_id, self._models.get(requested), body, prompt_tokens
        )
        if ticket is not None:
            info.on_attempt = ticket.attempted
            if info.record.trace is not None:
                info.record.trace.admission_started()
        return ticket

    async def _admitted(self, ticket: Ticket | None, info: RequestInfo, plan: RoutePlan) -> None:
        """Wait for the limits' verdict; a refusal gives the plan's leases back unused.
        Raises RateLimitedError, BudgetExceededError, LimitsUnavailableError."""
        if ticket is None:
            return
        trace = info.record.trace
        try:
            await ticket.decide()
        except GatewayError as err:
            if trace is not None:
                trace.admitted(error_code(err))
            await self._dispatcher.release_plan(info, plan)
            raise
        if trace is not None:
            trace.admitted()

    async def _until_disconnect(self, req: HttpRequest, fn: Any, *args: Any) -> None:
        """Run ``fn`` but cancel it when the client goes away (not counted as a failure)."""
        with anyio.CancelScope() as scope:

            async def watch() -> None:
                while (await req.receive())["type"] != "http.disconnect":
                    pass
                scope.cancel()

            watcher = asyncio.create_task(watch())
            try:
                await fn(*args)
            except RecursionError:
                # A body nested just short of what decoding refuses still cannot be encoded
                # again deeper in the stack (for the upstream): the same refusal.
                raise _too_deep() from None
            finally:
                watcher.cancel()

    async def _serve_once(
        self,
        req: HttpRequest,
        surface: Surface,
        info: RequestInfo,
        plan: RoutePlan,
        body: JSON,
        requested: str,
        raw: JSON,
        walk: PlanWalk,
    ) -> None:
        rendered = b""

        async def complete(adapter: Adapter, target: UpstreamTarget) -> JSON:
            nonlocal rendered
            answer = await adapter.complete(target, body)
            # Rendered within the attempt: an answer the client's shape cannot express is
            # this route's bad response, and the next route may still serve.
            shown = requested if walk.steered is None else info.model
            rendered = surface.render(answer, shown, raw)
            return answer

        served = await self._dispatcher.call(info, plan, complete, walk)
        self._served(walk, info, requested)
        await req.respond(
            200,
            rendered,
            [
                (b"x-routed-via", served.candidate.endpoint.encode()),
                (b"x-request-id", info.request_id.encode()),
                info.record.overhead_header(),
            ],
        )

    async def _serve_stream(
        self,
        req: HttpRequest,
        surface: Surface,
        info: RequestInfo,
        plan: RoutePlan,
        body: JSON,
        requested: str,
        raw: JSON,
        walk: PlanWalk,
    ) -> None:
        stream = await self._dispatcher.open_stream(info, plan, body, walk)
        try:
            shown = self._served(walk, info, requested)
            await self._relay(req, surface.stream(shown, raw), stream, info)
        finally:  # however the relay ends, its capacity lease goes back (a no-op once closed)
            await self.leases.release(stream.candidate)

    async def _relay(
        self, req: HttpRequest, renderer: Any, stream: StreamAttempt, info: RequestInfo
    ) -> None:
        outcome, failure = "success", None
        unsent: list[bytes] = []  # rendered frames not yet written
        try:
            await req.start(
                200,
                [
                    *_SSE_HEADERS,
                    (b"x-routed-via", stream.candidate.endpoint.encode()),
                    (b"x-request-id", info.request_id.encode()),
                    info.record.overhead_header(),
                ],
            )
            async for batch in stream.batches():
                # One write per upstream read (a client send costs far more than the frames),
                # and the last read's frames go out with the end of the answer.
                for chunk in batch:
                    unsent += renderer.feed(chunk)
                if unsent and not batch.last:
                    await req.chunk(b"".join(unsent))
                    unsent.clear()
            tail = renderer.finish()
        except UpstreamError as err:
            outcome, failure = "failure", err
            logger.warning(
                "stream from %s broke after commit: %s", stream.candidate.endpoint, err.message
            )
            tail = renderer.error(f"upstream stream broke: {err.message}")
        except anyio.get_cancelled_exc_class():
            await stream.close("cancelled")
            raise
        try:
            await req.chunk(b"".join([*unsent, *tail]), more=False)
        finally:
            await stream.close(outcome, failure)

    async def _embeddings(self, req: HttpRequest, record: RequestRecord) -> None:
        body, size = await self._read_json(req)
        raw = validate_embeddings_request(body)
        requested = raw["model"]
        client_metadata(req)
        info = self._info(req, "embeddings", False, record=record)
        ticket = self._admission(req, info, requested, None, estimate_prompt_tokens(size))
        try:
            await self._embed(req, raw, requested, info, ticket)
        finally:
            if ticket is not None:
                await ticket.finish()

    async def _embed(
        self, req: HttpRequest, raw: JSON, requested: str, info: RequestInfo, ticket: Ticket | None
    ) -> None:

        def ask(model: ModelConfig) -> Awaitable[RoutePlan]:
            return self._plan_for(model, raw, "embeddings", req, info)

        walk = await self.walk(requested, req, info, ask, body=raw)
        plan = await walk.first()
        await self._admitted(ticket, info, plan)

        async def embed(adapter: Adapter, target: UpstreamTarget) -> JSON:
            return await adapter.embed(target, raw)

        async def run() -> None:
            served = await self._dispatcher.call(info, plan, embed, walk)
            served.body["model"] = self._served(walk, info, requested)
            await req.respond(
                200,
                _encode(served.body),
                [
                    (b"x-routed-via", served.candidate.endpoint.encode()),
                    (b"x-request-id", info.request_id.encode()),
                    info.record.overhead_header(),
                ],
            )

        await self._until_disconnect(req, run)

    # -- introspection ------------------------------------------------------------------

    async def _list_models(self, req: HttpRequest) -> None:
        """``GET /v1/models``: the models (and steering ids) the caller may call, in the
        OpenAI list shape, or Anthropic's for a caller that sends ``anthropic-version``."""
        ids = [(m.id, m.owned_by) for m in self._config.models if m.published and may_call(req, m)]
        ids += [(name, "llmgw") for name in self.steering.book.advertised(caller_of(req).org)]
        anthropic = req.header("anthropic-version") is not None
        data = [
            _model_entry(model_id, owner, self._loaded_at, anthropic=anthropic)
            for model_id, owner in ids
        ]
        if anthropic:
            page: dict[str, Any] = {
                "data": data,
                "has_more": False,
                "first_id": ids[0][0] if ids else None,
                "last_id": ids[-1][0] if ids else None,
            }
        else:
            page = {"object": "list", "data": data}
        await req.respond(200, _encode(page))

    async def _retrieve_model(self, req: HttpRequest) -> None:
        """``GET /v1/models/{id}``: one model as ``/v1/models`` lists it; an alias answers
        as its model. Raises RouteNotFoundError as inference would (hidden = absent)."""
        name = req.path[len(_MODELS_PREFIX) :]
        anthropic = req.header("anthropic-version") is not None
        if is_steering(name):
            # auto, auto:<axis> and auto:<chain> answer as /v1/models lists them.
            model_id, owner = ascii_lower(name), "llmgw"
            suffix = model_id[len("auto:") :]
            listed = self.steering.book.advertised(caller_of(req).org)
            if model_id not in listed and suffix not in AXIS_SYNONYMS:
                raise RouteNotFoundError(f"the model {bounded(name)!r} does not exist")
        else:
            model = self._resolve(name, req)
            model_id, owner = model.id, model.owned_by
        entry = _model_entry(model_id, owner, self._loaded_at, anthropic=anthropic)
        await req.respond(200, _encode(entry))

    async def _count_tokens(self, req: HttpRequest) -> None:
        """``POST /v1/messages/count_tokens``: the gateway's own prompt estimate (the one
        its context-window check uses), not the model's tokenizer. Raises
        InvalidRequestError, RouteNotFoundError."""
        raw, size = await self._read_json(req)
        body = anthropic_messages.to_chat_request(raw, counting=True)
        self._resolve(str(body["model"]), req)
        await req.respond(200, _encode({"input_tokens": estimate_prompt_tokens(size)}))

    async def _mode_reply(self) -> ModeChanged | None:
        """The deployment mode from its owner (an actor always running beside the others);
        None when the actors do not answer within :data:`_PROBE_TIMEOUT_S`."""
        try:
            reply = await self._bus.request(
                subjects.MODE_GET, ModeRequest(), reply_type=ModeChanged, timeout=_PROBE_TIMEOUT_S
            )
        except GatewayError:
            return None
        return reply if isinstance(reply, ModeChanged) else None

    async def _mode(self) -> dict[str, Any]:
        """The deployment mode's fields; ``unknown`` when the actors do not answer."""
        reply = await self._mode_reply()
        if reply is None:
            return {"mode": "unknown", "mode_since": None}
        return {"mode": reply.mode, "mode_since": reply.since, "healthy_ratio": reply.ratio}

    async def _health(self, req: HttpRequest) -> None:
        """Liveness: always 200 while this process serves; ``status`` says whether the actors
        answer."""
        routes = sum(len(m.route) for m in self._config.models)
        mode = await self._mode()
        status = "actors_unreachable" if mode["mode"] == "unknown" else "ok"
        # pid: which process answered (one of several under `llmgw serve --workers N`).
        body = {"status": status, "routes_configured": routes, "pid": self._pid, **mode}
        await req.respond(200, _encode(body))

    async def _ready(self, req: HttpRequest) -> None:
        """Readiness: 200 once the actors answer (one cheap bus request), else 503. The mode
        owner starts last in the actor tree, so its answer means the whole tree serves."""
        if await self._mode_reply() is not None:
            await req.respond(200, _encode({"status": "ready"}))
            return
        await req.respond(
            503,
            _encode({"status": "unready", "reason": "the actors do not answer"}),
            [(b"retry-after", DEFAULT_RETRY_AFTER)],
        )

    def _visible(self, req: HttpRequest, model_id: str) -> bool:
        """Whether ``/routing`` and ``/health/deep`` show ``model_id`` to ``req``'s caller:
        admins see every model; others what they may call, so a hidden model is absent
        exactly like one that does not exist."""
        if caller_of(req).is_admin:
            return True
        model = self._models.get(model_id)
        if model is None or model.id != model_id:  # an alias is not a model of its own
            return False
        return model.published and may_call(req, model)

    async def _health_deep(self, req: HttpRequest) -> None:
        report = raise_for_reply(
            await self._bus.request(
                subjects.HEALTH_DEEP,
                HealthRequest(),
                reply_type=HealthReport,
                timeout=self._config.routing.decision_timeout_seconds,
            )
        )
        endpoints: dict[str, Any] = {}
        degraded = False
        floor = self._config.routing.circuit.min_availability
        for st in report.endpoints:
            if not self._visible(req, st.model):
                continue
            # A rejected credential fails every caller: it degrades from the first rejection,
            # long before the availability average notices (spec "Endpoint health").
            rejected = st.consecutive_auth_rejections > 0
            if st.circuit_state != "closed" or st.availability < _DEGRADED_AVAILABILITY or rejected:
                degraded = True
            endpoints[st.endpoint] = {
                "model": st.model,
                "availability": st.availability,
                "healthy": st.availability >= floor and not rejected,
                "circuit_state": st.circuit_state,
                "consecutive_failures": st.consecutive_failures,
                "consecutive_auth_rejections": st.consecutive_auth_rejections,
                "benched_until": st.benched_until,
                "bench_reason": st.bench_reason,
                **await self.callers.details(req, st.endpoint),
            }
        mode = await self._mode()
        models = {eid: m.id for m in self._config.models for eid in m.endpoint_ids()}
        capacity, unresolved = await capacity_lines(
            self._bus,
            self._config,
            lambda e: self._visible(req, models.get(e, "")),
            self._config.routing.decision_timeout_seconds,
        )
        degraded = degraded or unresolved or mode["mode"] == "degraded"
        await req.respond(
            200,
            _encode(
                {
                    "status": "degraded" if degraded else "ok",
                    **mode,
                    "endpoints": endpoints,
                    "capacity": capacity,
                    "rules": self.rules.health(),
                    "load": await self._load_health(req),
                    "routewise": await self._routewise_health(req),
                }
            ),
        )

    async def _model_status(self, model_id: str) -> ModelStatus:
        """The ModelActor's status of ``model_id``. Raises what its error reply carries."""
        return raise_for_reply(
            await self._bus.request(
                subjects.model_status(model_id),
                ModelStatusRequest(),
                reply_type=ModelStatus,
                timeout=self._config.routing.decision_timeout_seconds,
            )
        )

    async def _load_health(self, req: HttpRequest) -> dict[str, Any]:
        """Per model, per route: requests in flight, the learned concurrency limit (and what
        last moved it), the TTFT baseline and recent average it is judged by, and until when
        its keys are cooling after a 429 (one status request per model)."""
        out: dict[str, Any] = {}
        for m in self._config.models:
            if not self._visible(req, m.id):
                continue
            status = await self._model_status(m.id)
            out[m.id] = {
                r.endpoint: {
                    "in_flight": r.in_flight,
                    "learned_limit": r.learned_limit,
                    "limit_reason": r.limit_reason,
                    "ttft_baseline_ms": r.ttft_baseline_ms,
                    "ttft_recent_ms": r.ttft_recent_ms,
                    "cooling_until": r.cooling_until,
                }
                for r in status.routes
            }
        return out

    async def _routewise_health(self, req: HttpRequest) -> dict[str, Any]:
        """Per RouteWise model: each candidate's effective cost, latency estimate, LP weight,
        quota used fraction and free slots (one status request per RouteWise model)."""
        out: dict[str, Any] = {}
        default = self._config.routing.default_router
        for m in self._config.models:
            if (m.router or default) != "routewise" or not self._visible(req, m.id):
                continue
            status = await self._model_status(m.id)
            out[m.id] = {
                "prompt_tokens": status.routewise_prompt_tokens,
                "candidates": [msgspec.structs.asdict(c) for c in status.routewise],
            }
        return out

    async def _routing(self, req: HttpRequest) -> None:
        models: dict[str, Any] = {}
        for m in self._config.models:
            if not self._visible(req, m.id):
                continue
            status = await self._model_status(m.id)
            models[m.id] = {
                "router": status.router,
                "routes": [
                    {
                        "endpoint": r.endpoint,
                        "provider": r.kind,
                        "weight": r.weight,
                        "circuit_state": r.circuit_state,
                        **await self.callers.details(req, r.endpoint),
                    }
                    for r in status.routes
                ],
            }
        await req.respond(200, _encode({"models": models}))

    # -- admin --------------------------------------------------------------------------

    async def _explain(self, req: HttpRequest) -> None:
        if not is_admin(req, self._config):
            raise UnauthorizedError("admin endpoints need the admin key")
        result = await explain.explain(
            req,
            self._bus,
            self.callers.auth,
            info_of=self.request_info,
            walk=functools.partial(self.walk, explore=False),
            plan=functools.partial(self._plan_for, dry=True),
            rules=self._explain_rules,
        )
        await req.respond(200, _encode(result))

    async def _explain_rules(
        self, requested: str, body: JSON, req: HttpRequest, info: RequestInfo
    ) -> list[JSON]:
        """Explain's rules section: every rule and its outcome for an ``auto`` request."""
        if not self.rules.applies(requested):
            return []
        book = await self.steering.book_for(requested)
        return self.rules.explain_request(body, req, info, book, caller_of(req).org)

    async def _admin_limits(self, req: HttpRequest) -> None:
        if not is_admin(req, self._config):
            raise UnauthorizedError("admin endpoints need the admin key")
        await admin_limits.limits_http(
            req, self._bus, self._config.routing.decision_timeout_seconds
        )
        if req.method != "GET":
            await self.admission.refresh()

    async def _admin_weights(self, req: HttpRequest) -> None:
        if not is_admin(req, self._config):
            raise UnauthorizedError("admin endpoints need the admin key")
        await admin_routing.set_weight(
            req, self._bus, self._config, self._config.routing.decision_timeout_seconds
        )


def _model_entry(model_id: str, owned_by: str, created: int, *, anthropic: bool) -> dict[str, Any]:
    """One model in the OpenAI shape, or the Anthropic SDK's ``ModelInfo``; ``created`` (unix
    seconds) is when this ingress loaded its config."""
    if anthropic:
        return {
            "type": "model",
            "id": model_id,
            "display_name": model_id,
            "created_at": datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lifecycle": "active",
        }
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def _lease_max_age(config: GatewayConfig) -> float:
    """The longest a lease of any pool may live (the keeper stops renewing it then)."""
    return config.routing.leases.max_age(
        route.timeout_seconds for m in config.models for route in m.route
    )


def create_app(bus: Bus, config: GatewayConfig) -> GatewayApp:
    """The ASGI application for ``config`` on ``bus``."""
    return GatewayApp(bus, config)
