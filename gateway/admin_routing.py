"""Admin HTTP API for routing: ``PUT``/``DELETE /admin/routing/weights/{model}/{endpoint}``.

A thin client of the owning ModelActor (``llmgw.model.<id>.weights``): the change applies at
once for every ingress on the bus and is kept in the actor's snapshot across restarts.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import msgspec

from bus import Bus
from gateway.http import HttpRequest
from schemas import (
    InvalidRequestError,
    ModelStatus,
    RouteNotFoundError,
    SetWeight,
    raise_for_reply,
    subjects,
)
from schemas.config import GatewayConfig

PREFIX = "/admin/routing/weights/"
_encode = msgspec.json.Encoder().encode


def _target(path: str, config: GatewayConfig) -> tuple[str, str]:
    """(model id, endpoint id) from ``.../{model}/{endpoint}``; ids may contain ``/``, so the
    model is the longest configured id that prefixes the rest. Raises RouteNotFoundError."""
    rest = unquote(path[len(PREFIX):])
    for m in sorted(config.models, key=lambda m: len(m.id), reverse=True):
        for name in (m.id, *m.aliases):
            if rest.startswith(name + "/"):
                return m.id, rest[len(name) + 1:]
    raise RouteNotFoundError(f"no model matches {rest!r}")


async def set_weight(req: HttpRequest, bus: Bus, config: GatewayConfig, timeout: float) -> None:
    """PUT sets ``{"weight": w}``; DELETE restores the configured weight."""
    model, endpoint = _target(req.path, config)
    weight: float | None = None
    if req.method == "PUT":
        try:
            body: Any = msgspec.json.decode(await req.body(64 * 1024))
        except msgspec.DecodeError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        w = body.get("weight") if isinstance(body, dict) else None
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise InvalidRequestError("'weight' must be a number", param="weight")
        weight = float(w)
    reply = await bus.request(subjects.model_weights(model), SetWeight(endpoint=endpoint,
                              weight=weight), reply_type=ModelStatus, timeout=timeout)
    status = raise_for_reply(reply)
    await req.respond(200, _encode({
        "model": status.model,
        "routes": [{"endpoint": r.endpoint, "weight": r.weight,
                    "configured_weight": r.configured_weight} for r in status.routes],
    }))
