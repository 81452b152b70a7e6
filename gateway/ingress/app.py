"""create_app(bus, config): the ingress, a plain ASGI app (server-agnostic, no framework).

This module is the composition root: it builds the ingress's components (one list, started
in order, reconfigured in order, closed in reverse) and the one route table, then per
request finds the route, runs the auth gate and answers any error in the caller's shape.
What a route does lives with its component: inference in ``pipeline``, the model list and
health in ``introspection``, explain, limits and weights in ``admin_routes``, metrics, events
and the admin API in ``operations``.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from gateway.adapters.registry import Upstreams
from gateway.admin import limits as admin_limits
from gateway.admin import routewise as admin_routewise
from gateway.admin import routing as admin_routing
from gateway.admin import rules as admin_rules
from gateway.admin.http import PREFIX as ADMIN_PREFIX
from gateway.admin.keys import AdminKeys
from gateway.admin.routewise import RouteWiseAdmin
from gateway.admin.rules import RulesAdmin
from gateway.auth.callers import Callers
from gateway.dashboard import Dashboard
from gateway.dashboard.server import PREFIX as DASHBOARD_PREFIX
from gateway.http.errors import (
    client_code,
    client_message,
    client_param,
    error_headers,
    error_param,
    http_status,
)
from gateway.http.request import HttpRequest, Receive, Scope, Send, request_ids
from gateway.ingress import explain
from gateway.ingress.admin_routes import AdminRoutes
from gateway.ingress.admission import Admission
from gateway.ingress.clock import SYSTEM_CLOCK, IngressClock
from gateway.ingress.introspection import MODELS_PREFIX, Introspection
from gateway.ingress.operations import IngressOps
from gateway.ingress.pipeline import Inference
from gateway.ingress.settling import LeaseKeeper
from gateway.ingress.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from gateway.steering.rules import RulesView
from gateway.steering.view import SteeringView
from schemas import GatewayError, RouteNotFoundError

if TYPE_CHECKING:
    import random
    from collections.abc import Iterable, Mapping, Sequence

    from bus import Bus
    from gateway.adapters.base import Adapter
    from gateway.http.component import Component
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], Awaitable[None]]
_ANY_METHOD = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The API shape errors on a path answer in (anything else under /v1/messages/ is Anthropic's,
# all the rest OpenAI's).
_SURFACES = {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}


class Route(NamedTuple):
    """One route: ``path`` is exact, or with ``prefix`` the start of paths carrying an id."""

    method: str
    path: str
    handler: Handler
    prefix: bool = False


class RouteTable:
    """The routes, looked up exact first, then by the longest matching prefix (so the order
    routes are listed in never matters)."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self._exact: dict[tuple[str, str], Handler] = {}
        self._prefixes: list[Route] = []
        for route in routes:
            if route.prefix:
                self._prefixes.append(route)
            else:
                self._exact[route.method, route.path] = route.handler
        self._prefixes.sort(key=lambda r: -len(r.path))

    def find(self, method: str, path: str) -> Handler | None:
        """The handler of ``method`` on ``path``; None when no route serves it."""
        handler = self._exact.get((method, path))
        if handler is None:
            for route in self._prefixes:
                if route.method == method and path.startswith(route.path):
                    return route.handler
        return handler

    def allowed(self, path: str) -> list[str]:
        """The methods some route serves on ``path``, sorted: a 405's ``Allow`` (none: 404)."""
        methods = {m for m, p in self._exact if p == path}
        methods.update(r.method for r in self._prefixes if path.startswith(r.path))
        return sorted(methods)


class GatewayApp:
    """The ASGI ingress: its components and its route table. Holds no routing state of its
    own (that lives in the actors)."""

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
        self._config = config
        self._ids = request_ids()
        upstreams = Upstreams(adapters, max_answer_bytes=config.server.max_upstream_answer_bytes)
        # One holder id per ingress: its capacity leases are renewed and released under it.
        self.leases = LeaseKeeper(
            bus,
            config.routing.leases.ttl_seconds,
            f"ingress-{os.getpid():x}-{secrets.token_hex(3)}",
            max_age=config.lease_max_age(),
            clock=clock.steady,
        )
        # Callers and credentials: the auth gate and the grants of database keys' secrets,
        # which the targets read (passed in, never a module global).
        self.callers = Callers(bus, config)
        self._gate = self.callers.auth.gate
        steering = SteeringView(bus, config)
        rules = RulesView(bus)
        admission = Admission(bus, config)  # callers' limits, asked beside the routing request
        self.ops = IngressOps(bus, config)  # accounting, /metrics, /events, /admin/<area>/...
        self.ops.after_admin.update(
            chains=steering.refresh, steering=steering.refresh, limits=admission.refresh
        )
        # The operator dashboard: its API is the admin routes of the table, with a session.
        dashboard = Dashboard(bus, config, self.callers.auth, self._admin_route)
        inference = Inference(
            bus,
            config,
            adapters=upstreams.adapters,
            secrets=self.callers.secrets,
            leases=self.leases,
            admission=admission,
            steering=steering,
            rules=rules,
            clock=clock,
            rng=rng,
        )
        introspection = Introspection(
            bus,
            config,
            targeting=inference.targeting,
            steering=steering,
            rules=rules,
            callers=self.callers,
            loaded_at=int(clock.wall()),
        )
        admin = AdminRoutes(
            bus,
            config,
            inference=inference,
            auth=self.callers.auth,
            admission=admission,
            steering=steering,
            rules=rules,
        )
        rules_admin = RulesAdmin(bus, config)
        routewise_admin = RouteWiseAdmin(bus, config)
        self._components: Sequence[Component] = (
            upstreams,
            self.leases,
            self.callers,
            steering,
            rules,
            dashboard,
            admission,
            self.ops,
            inference,
            introspection,
            admin,
            rules_admin,
            routewise_admin,
        )
        accounted = self.ops.accounting.wrap  # inference routes make a request-log row
        keys = AdminKeys(bus, self.callers.auth)  # /admin/keys, /admin/provider-keys
        self._routes = RouteTable(
            [
                Route("POST", "/v1/chat/completions", accounted(inference.chat, "chat")),
                Route("POST", "/v1/responses", accounted(inference.responses, "responses")),
                Route("POST", "/v1/messages", accounted(inference.messages, "messages")),
                Route("POST", "/v1/embeddings", accounted(inference.embeddings, "embeddings")),
                Route("POST", "/v1/messages/count_tokens", inference.count_tokens),
                Route("GET", "/v1/models", introspection.list_models),
                Route("GET", MODELS_PREFIX, introspection.retrieve_model, prefix=True),
                Route("GET", "/health", introspection.health),
                Route("GET", "/health/ready", introspection.ready),
                Route("GET", "/health/deep", introspection.health_deep),
                Route("GET", "/routing", introspection.routing),
                Route("GET", "/metrics", self.ops.serve_metrics),
                Route("GET", "/events", self.ops.serve_events),
                Route("POST", explain.PATH, admin.explain),
                Route("GET", admin_limits.PATH, admin.limits),
                *(Route(m, admin_limits.PREFIX, admin.limits, True) for m in _ANY_METHOD),
                Route("PUT", admin_routing.PREFIX, admin.weights, prefix=True),
                Route("DELETE", admin_routing.PREFIX, admin.weights, prefix=True),
                Route("GET", admin_rules.PATH, rules_admin.get),
                Route("PUT", admin_rules.PATH, rules_admin.put),
                Route("GET", admin_routewise.MODEL_SETTINGS, routewise_admin.model_settings),
                Route("GET", admin_routewise.SETTINGS, routewise_admin.settings),
                Route("PATCH", admin_routewise.SETTINGS, routewise_admin.settings),
                Route("PATCH", admin_routewise.KEY_PREFIX, routewise_admin.model_setting, True),
                Route("DELETE", admin_routewise.KEY_PREFIX, routewise_admin.model_setting, True),
                Route("GET", "/admin/keys", keys.list_keys),
                Route("POST", "/admin/keys", keys.create_key),
                Route("POST", "/admin/keys/", keys.revoke_key, prefix=True),
                Route("DELETE", "/admin/keys/", keys.revoke_key, prefix=True),
                Route("GET", "/admin/provider-keys", keys.list_provider_keys),
                Route("POST", "/admin/provider-keys", keys.add_provider_key),
                Route("POST", "/admin/provider-keys/min-role-env", keys.reserve_env_key),
                Route("POST", "/admin/provider-keys/", keys.set_min_role, prefix=True),
                Route("DELETE", "/admin/provider-keys/", keys.delete_provider_key, prefix=True),
                # /admin/<area>/<verb>: the admin API for any path no longer prefix serves
                Route("GET", ADMIN_PREFIX, self.ops.serve_admin, prefix=True),
                Route("POST", ADMIN_PREFIX, self.ops.serve_admin, prefix=True),
                *(
                    Route(m, DASHBOARD_PREFIX, dashboard.handle, prefix=True)
                    for m in _ANY_METHOD
                    if config.dashboard.enabled
                ),
            ]
        )

    # -- lifetime -----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(
                HttpRequest(
                    scope,
                    receive,
                    send,
                    self._config.server.body_timeout_seconds,
                    request_id=next(self._ids),
                )
            )
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                for component in self._components:
                    await component.start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def aclose(self) -> None:
        """Close every component, last started first: deliver the request-log rows kept, stop
        following events and renewing leases, close the upstream HTTP client."""
        for component in reversed(self._components):
            await component.aclose()

    def reconfigure(self, config: GatewayConfig) -> None:
        """Serve ``config`` from the next request on (config reload). Requests in flight keep
        the model and plan they started with; their targets still resolve."""
        self._config = config
        for component in self._components:
            component.reconfigure(config)

    # -- one request ----------------------------------------------------------------------

    async def _http(self, req: HttpRequest) -> None:
        scope = req.scope  # what ``req.path`` and ``req.method`` read
        path, method = scope["path"], scope["method"]
        surface = _surface_for(req, path)
        try:
            raw = scope.get("raw_path")  # absent where a server gives only the decoded path
            if raw is not None and b"%" in raw:
                # Routed on the raw path split first, each segment decoded once: an escaped
                # "/" is no separator (``/v1%2Fmodels``, ``/admin/chains%2Flist`` are no
                # route). Without a "%" that is the decoded path: no work for nearly every
                # request.
                path = req.split_path()
            handler = self._routes.find(method, path)
            if handler is None:
                if allowed := self._routes.allowed(path):
                    allow = [(b"allow", ", ".join(allowed).encode())]  # RFC 9110 wants it
                    await _send_error(
                        req, surface, 405, "method not allowed", "invalid_request", allow
                    )
                else:
                    await _send_error(req, surface, 404, f"no such path {path}", "not_found")
                return
            await self._gate(req)
            await handler(req)
        except GatewayError as err:
            if not req.started:
                await _send_gateway_error(req, surface, err)
        except Exception:
            logger.exception("unhandled error serving %s %s (%s)", method, path, req.request_id)
            if not req.started:
                await _send_error(req, surface, 500, "internal gateway error", "internal")

    async def _admin_route(self, req: HttpRequest) -> None:
        """Serve ``req`` with the handler its (admin) path has; the dashboard's API. Raises
        RouteNotFoundError for a path no route serves."""
        path = req.split_path()
        handler = self._routes.find(req.method, path)
        if handler is None or path.startswith(DASHBOARD_PREFIX):
            raise RouteNotFoundError(f"no such path {path}")
        await handler(req)


def _surface_for(req: HttpRequest, path: str) -> Surface:
    """The shape an error to ``req`` takes: its surface's, and for ``/v1/models`` Anthropic's
    when the caller sends ``anthropic-version`` (as its successful answers are)."""
    surface = _SURFACES.get(path)
    if surface is not None:
        return surface
    if path.startswith("/v1/messages/"):
        return MESSAGES
    if (path == MODELS_PREFIX.rstrip("/") or path.startswith(MODELS_PREFIX)) and req.header(
        "anthropic-version"
    ) is not None:
        return MESSAGES
    return CHAT


async def _send_gateway_error(req: HttpRequest, surface: Surface, err: GatewayError) -> None:
    status = http_status(err, relays_overload=surface.relays_overload)
    param = client_param(err) if surface is CHAT else error_param(err)
    await req.respond(
        status,
        surface.error_body(status, client_message(err), client_code(err), param),
        error_headers(err),
    )


async def _send_error(
    req: HttpRequest,
    surface: Surface,
    status: int,
    message: str,
    code: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await req.respond(status, surface.error_body(status, message, code, None), headers)


def create_app(bus: Bus, config: GatewayConfig) -> GatewayApp:
    """The ASGI application for ``config`` on ``bus``."""
    return GatewayApp(bus, config)
