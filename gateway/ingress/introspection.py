"""What the ingress says about itself and its models, read from the actors over the bus.

``GET /v1/models`` and ``/v1/models/{id}`` (the models a caller may call, in the OpenAI or
the Anthropic shape); ``GET /health`` (liveness), ``/health/ready`` (readiness: the actors
answer), ``/health/deep`` (endpoints, capacity, rules, load, RouteWise) and ``GET /routing``
(each model's routes). A caller sees only the models it may call; an admin sees all.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.auth.gate import caller_of, may_call
from gateway.http.component import Component
from gateway.http.errors import DEFAULT_RETRY_AFTER
from gateway.http.request import bounded
from gateway.ingress.capacity_health import capacity_lines
from gateway.ingress.model_pages import anthropic_page
from gateway.steering.resolver import is_steering
from schemas import (
    GatewayError,
    HealthReport,
    HealthRequest,
    ModeChanged,
    ModelStatus,
    ModelStatusRequest,
    ModeRequest,
    RouteNotFoundError,
    raise_for_reply,
    subjects,
)
from schemas.catalog import AXIS_SYNONYMS, ascii_lower

if TYPE_CHECKING:
    from bus import Bus
    from gateway.auth.callers import Callers
    from gateway.http.request import HttpRequest
    from gateway.ingress.plan_walk import Targeting
    from gateway.steering.rules import RulesView
    from gateway.steering.view import SteeringView
    from schemas.config import GatewayConfig

_encode = msgspec.json.Encoder().encode
_DEGRADED_AVAILABILITY = 0.9
_PROBE_TIMEOUT_S = 1.0  # /health and /health/ready: how long the actors may take to answer
MODELS_PREFIX = "/v1/models/"


class Introspection(Component):
    """Serves the model list, health and routing endpoints of the config it serves. Holds
    no state of its own beyond the config and when it was loaded."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        *,
        targeting: Targeting,
        steering: SteeringView,
        rules: RulesView,
        callers: Callers,
        loaded_at: int,
    ) -> None:
        """``loaded_at`` (unix seconds) is the models' ``created``: no model has a release
        date in the config."""
        self._bus = bus
        self._config = config
        self._targeting = targeting
        self._steering = steering
        self._rules = rules
        self._callers = callers
        self._loaded_at = loaded_at
        self._pid = os.getpid()

    def reconfigure(self, config: GatewayConfig) -> None:
        """Describe ``config`` from the next request on."""
        self._config = config

    # -- the models -----------------------------------------------------------------------

    async def list_models(self, req: HttpRequest) -> None:
        """``GET /v1/models``: the models (and steering ids) the caller may call, in the
        OpenAI list shape, or one page of Anthropic's for a caller that sends
        ``anthropic-version``. Raises InvalidRequestError for a page query it cannot
        answer (``model_pages``)."""
        ids = [(m.id, m.owned_by) for m in self._config.models if m.published and may_call(req, m)]
        ids += [(name, "llmgw") for name in self._steering.book.advertised(caller_of(req).org)]
        anthropic = req.header("anthropic-version") is not None
        data = [
            _model_entry(model_id, owner, self._loaded_at, anthropic=anthropic)
            for model_id, owner in ids
        ]
        if anthropic:  # its SDK pages through the list with cursors
            page = anthropic_page(data, bytes(req.scope.get("query_string", b"")))
        else:
            page = {"object": "list", "data": data}
        await req.respond(200, _encode(page))

    async def retrieve_model(self, req: HttpRequest) -> None:
        """``GET /v1/models/{id}``: one model as ``/v1/models`` lists it; an alias answers
        as its model. The id is the rest of the raw path, each segment decoded once, so
        ``openai/gpt-4o`` answers sent as it is or as ``openai%2Fgpt-4o`` (what OpenAI's SDK
        sends) on every HTTP engine, and ``%25`` stays a ``%``. Raises RouteNotFoundError as
        inference would (hidden = absent), InvalidRequestError for a path that does not
        decode."""
        name = "/".join(req.segments_after(MODELS_PREFIX))
        anthropic = req.header("anthropic-version") is not None
        if is_steering(name):
            # auto, auto:<axis> and auto:<chain> answer as /v1/models lists them.
            model_id, owner = ascii_lower(name), "llmgw"
            suffix = model_id[len("auto:") :]
            listed = self._steering.book.advertised(caller_of(req).org)
            if model_id not in listed and suffix not in AXIS_SYNONYMS:
                raise RouteNotFoundError(f"the model {bounded(name)!r} does not exist")
        else:
            model = self._targeting.resolve(name, req)
            model_id, owner = model.id, model.owned_by
        entry = _model_entry(model_id, owner, self._loaded_at, anthropic=anthropic)
        await req.respond(200, _encode(entry))

    # -- health -----------------------------------------------------------------------------

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

    async def health(self, req: HttpRequest) -> None:
        """Liveness: always 200 while this process serves; ``status`` says whether the actors
        answer."""
        routes = sum(len(m.route) for m in self._config.models)
        mode = await self._mode()
        status = "actors_unreachable" if mode["mode"] == "unknown" else "ok"
        # pid: which process answered (one of several under `llmgw serve --workers N`).
        body = {"status": status, "routes_configured": routes, "pid": self._pid, **mode}
        await req.respond(200, _encode(body))

    async def ready(self, req: HttpRequest) -> None:
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
        model = self._targeting.models.get(model_id)
        if model is None or model.id != model_id:  # an alias is not a model of its own
            return False
        return model.published and may_call(req, model)

    async def health_deep(self, req: HttpRequest) -> None:
        """``GET /health/deep``. Raises what the health owner's error reply carries."""
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
                **await self._callers.details(req, st.endpoint),
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
                    "rules": self._rules.health(),
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
        its keys are cooling after a 429 and its reported rate limit is spent (one status
        request per model)."""
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
                    "rate_limit_until": r.rate_limit_until,
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

    async def routing(self, req: HttpRequest) -> None:
        """``GET /routing``: each visible model's router and routes (admins also see base
        URLs and credentials). Raises what a ModelActor's error reply carries."""
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
                        **await self._callers.details(req, r.endpoint),
                    }
                    for r in status.routes
                ],
            }
        await req.respond(200, _encode({"models": models}))


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
