"""RoutingAdminActor: owns the admin areas ``routing`` and ``bench`` on the bus.

Weights live in each ModelActor and benches in each EndpointActor; this actor is the one
owner operators address (``llmgw.admin.routing.<verb>``, ``llmgw.admin.bench.<verb>``), and
it forwards each command to the actor whose state it changes:

- ``routing.set_weight`` {model, endpoint, weight} · ``routing.reset_weight`` {model,
  endpoint} · ``routing.weights`` {model?} (read only)
- ``bench.lift`` {endpoint}: end a route's model bench and its keys' mutes now (never before
  a provider's Retry-After, which the EndpointActor and the KeyPoolActor keep as floors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea, number_arg, text_arg
from actors.base import Actor, ActorContext
from actors.state.route_table import MAX_WEIGHT
from schemas import (
    AdminCommand,
    ModelStatus,
    ModelStatusRequest,
    ProbeResult,
    RouteNotFoundError,
    SetWeight,
    raise_for_reply,
    subjects,
)

if TYPE_CHECKING:
    from bus import Envelope

_FORWARD_TIMEOUT = 5.0


def _status(status: ModelStatus) -> dict[str, Any]:
    return {
        "model": status.model,
        "routes": [
            {
                "endpoint": r.endpoint,
                "weight": r.weight,
                "configured_weight": r.configured_weight,
                "fallback_only": r.fallback_only,
                "overridden": r.overridden,
            }
            for r in status.routes
        ],
    }


class RoutingAdminActor(Actor):
    """Answers the ``routing`` and ``bench`` admin areas by asking the owning actors."""

    def __init__(self, models: tuple[str, ...], endpoints: tuple[str, ...]) -> None:
        self.name = "routing_admin"
        self._models = models
        self._endpoints = frozenset(endpoints)
        self.routing = AdminArea(
            "routing",
            {
                "set_weight": self._set_weight,
                "reset_weight": self._reset_weight,
                "weights": self._weights,
            },
            args={
                "set_weight": frozenset({"model", "endpoint", "weight"}),
                "reset_weight": frozenset({"model", "endpoint"}),
                "weights": frozenset({"model"}),
            },
        )
        self.bench = AdminArea(
            "bench", {"lift": self._lift}, args={"lift": frozenset({"endpoint"})}
        )
        self.serves = (self.routing.serve, self.bench.serve)

    async def on_start(self, ctx: ActorContext) -> None:
        """Nothing to build: the state lives in the ModelActors and EndpointActors."""
        self.ctx = ctx

    async def handle(self, env: Envelope) -> None:
        """Admin commands of areas ``routing`` and ``bench``."""
        for area in (self.routing, self.bench):
            if area.owns(env):
                await area.answer(self.ctx, env)

    async def _ask_model(self, model: str, msg: SetWeight | ModelStatusRequest) -> ModelStatus:
        if model not in self._models:
            raise RouteNotFoundError(f"no model {model!r}")
        subject = (
            subjects.model_weights(model)
            if isinstance(msg, SetWeight)
            else subjects.model_status(model)
        )
        reply = await self.ctx.bus.request(
            subject, msg, reply_type=ModelStatus, timeout=_FORWARD_TIMEOUT
        )
        return raise_for_reply(reply)

    async def _set_weight(self, cmd: AdminCommand) -> dict[str, Any]:
        weight = number_arg(cmd, "weight", low=0, high=MAX_WEIGHT)
        return _status(
            await self._ask_model(
                text_arg(cmd, "model"),
                SetWeight(endpoint=text_arg(cmd, "endpoint"), weight=weight),
            )
        )

    async def _reset_weight(self, cmd: AdminCommand) -> dict[str, Any]:
        return _status(
            await self._ask_model(
                text_arg(cmd, "model"), SetWeight(endpoint=text_arg(cmd, "endpoint"), weight=None)
            )
        )

    async def _weights(self, cmd: AdminCommand) -> dict[str, Any]:
        wanted = cmd.args.get("model")
        models = [wanted] if isinstance(wanted, str) and wanted else list(self._models)
        return {"models": [_status(await self._ask_model(m, ModelStatusRequest())) for m in models]}

    async def _lift(self, cmd: AdminCommand) -> dict[str, Any]:
        endpoint = text_arg(cmd, "endpoint")
        if endpoint not in self._endpoints:
            raise RouteNotFoundError(f"no endpoint {endpoint!r}")
        await self.ctx.publish(
            subjects.endpoint_probe_result(endpoint),
            ProbeResult(endpoint=endpoint, ok=True, detail="admin lift"),
        )
        return {"endpoint": endpoint, "lift": "requested"}
