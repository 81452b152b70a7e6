"""Admin HTTP API for routing: ``PUT``/``DELETE /admin/routing/weights/{model}/{endpoint}``.

A thin client of the admin commands ``llmgw.admin.routing.set_weight`` / ``reset_weight``
(answered by the RoutingAdminActor, which asks the owning ModelActor): the change applies at
once for every ingress on the bus and is kept in the ModelActor's snapshot across restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.admin.http import admin_request, refuse_too_large, refuse_unknown_fields
from gateway.auth.admin_access import requested_by
from schemas import InvalidRequestError, RouteNotFoundError

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

PREFIX = "/admin/routing/weights/"
_encode = msgspec.json.Encoder().encode
_WEIGHT_FIELDS = frozenset({"weight"})


def _target(req: HttpRequest, config: GatewayConfig) -> tuple[str, str]:
    """(model id, endpoint id) from ``.../{model}/{endpoint}``; ids may contain ``/`` (sent
    as is or as ``%2F``), so the model is the longest configured id that prefixes the rest.
    Raises RouteNotFoundError."""
    rest = "/".join(req.segments_after(PREFIX))  # each decoded once: %25 stays a %
    for m in sorted(config.models, key=lambda m: len(m.id), reverse=True):
        for name in (m.id, *m.aliases):
            if rest.startswith(name + "/"):
                return m.id, rest[len(name) + 1 :]
    raise RouteNotFoundError(f"no model matches {rest!r}")


async def set_weight(req: HttpRequest, bus: Bus, config: GatewayConfig, timeout: float) -> None:
    """PUT sets ``{"weight": w}``; DELETE restores the configured weight. A thin client of the
    admin commands ``routing.set_weight`` / ``routing.reset_weight``."""
    model, endpoint = _target(req, config)
    args: dict[str, Any] = {"model": model, "endpoint": endpoint}
    verb = "reset_weight"
    if req.method == "PUT":
        try:
            body: Any = msgspec.json.decode(await req.body(64 * 1024))
        except (msgspec.DecodeError, RecursionError):
            raise InvalidRequestError(
                "the request body is not valid JSON or is nested too deeply"
            ) from None
        if isinstance(body, dict):
            refuse_unknown_fields(body, _WEIGHT_FIELDS, f"PUT {PREFIX}{{model}}/{{endpoint}}")
        args["weight"] = body.get("weight") if isinstance(body, dict) else None
        refuse_too_large(args)
        verb = "set_weight"
    result = await admin_request(
        bus, "routing", verb, args, by=requested_by(req), timeout=timeout, request_id=req.request_id
    )
    await req.respond(200, _encode(result))
