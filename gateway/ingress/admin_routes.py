"""The admin endpoints that need the ingress's own parts: ``POST /admin/routing/explain``
(the live path's target resolution and plan, dry), ``/admin/limits...`` (callers' limits;
this ingress's admission reloads them after a change) and ``PUT``/``DELETE`` of a route's
weight. Every one needs the admin key."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import msgspec

from gateway.admin import limits as admin_limits
from gateway.admin import routing as admin_routing
from gateway.auth.admin_access import is_admin
from gateway.auth.gate import caller_of
from gateway.http.component import Component
from gateway.ingress import explain
from schemas import UnauthorizedError

if TYPE_CHECKING:
    from bus import Bus
    from gateway.adapters.base import JSON
    from gateway.auth.gate import Authenticator
    from gateway.http.request import HttpRequest
    from gateway.ingress.admission import Admission
    from gateway.ingress.pipeline import Inference
    from gateway.ingress.request_info import RequestInfo
    from gateway.steering.rules import RulesView
    from gateway.steering.view import SteeringView
    from schemas.config import GatewayConfig

_encode = msgspec.json.Encoder().encode


class AdminRoutes(Component):
    """Serves explain, the limits and the route weights for the config it serves. Raises
    UnauthorizedError for a caller without the admin key."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        *,
        inference: Inference,
        auth: Authenticator,
        admission: Admission,
        steering: SteeringView,
        rules: RulesView,
    ) -> None:
        self._bus = bus
        self._config = config
        self._inference = inference
        self._auth = auth
        self._admission = admission
        self._steering = steering
        self._rules = rules

    def reconfigure(self, config: GatewayConfig) -> None:
        """Check the admin key of ``config`` from the next request on."""
        self._config = config

    def _admin_only(self, req: HttpRequest) -> None:
        if not is_admin(req, self._config):
            raise UnauthorizedError("admin endpoints need the admin key")

    async def explain(self, req: HttpRequest) -> None:
        """``POST /admin/routing/explain``."""
        self._admin_only(req)
        targeting = self._inference.targeting
        result = await explain.explain(
            req,
            self._bus,
            self._auth,
            info_of=self._inference.request_info,
            walk=functools.partial(targeting.walk, explore=False),
            plan=functools.partial(targeting.plan_for, dry=True),
            rules=self._explain_rules,
        )
        await req.respond(200, _encode(result))

    async def _explain_rules(
        self, requested: str, body: JSON, req: HttpRequest, info: RequestInfo
    ) -> list[JSON]:
        """Explain's rules section: every rule and its outcome for an ``auto`` request."""
        if not self._rules.applies(requested):
            return []
        book = await self._steering.book_for(requested)
        return self._rules.explain_request(body, req, info, book, caller_of(req).org)

    async def limits(self, req: HttpRequest) -> None:
        """``/admin/limits`` and ``/admin/limits/...``."""
        self._admin_only(req)
        await admin_limits.limits_http(
            req, self._bus, self._config.routing.decision_timeout_seconds
        )
        if req.method != "GET":
            await self._admission.refresh()

    async def weights(self, req: HttpRequest) -> None:
        """``PUT``/``DELETE`` of a route's weight."""
        self._admin_only(req)
        await admin_routing.set_weight(
            req, self._bus, self._config, self._config.routing.decision_timeout_seconds
        )
