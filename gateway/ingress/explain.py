"""``POST /admin/routing/explain``: the decision the live path would make now, dry.

The body is ``{"path": "/v1/chat/completions", "body": {...}, "headers": {...}}`` (``path``
names the surface: chat, Responses, Messages or embeddings; ``headers`` are the caller's,
``authorization`` included, so the answer is that caller's; with auth on and no credential in
them, the asking admin's own, as the dashboard's "Try" sends it). It runs the live path's own
code — :meth:`~gateway.ingress.plan_walk.Targeting.walk` (target resolution from the views,
role filter, affinity) and the first model's plan (one bus round trip, like a request) — and
calls no upstream. Exploration is reported as its probability, not drawn. The plans are
asked dry: they report the half-open probe they would take without leasing it, take no
prefill lease and write no session-affinity pin, so a dry run changes nothing a request
sees.

Answer: ``target`` (how the model field resolved; ``rule`` names the routing rule that chose
it), ``rules`` (for ``auto``: every routing rule in order, matched or not, and for one that
did not, the clause that failed), ``candidates`` (each with per-axis
scores, weights, multipliers and final score), ``excluded`` (model and reason), ``order``
(the models the failover loop would walk), and ``plan`` (the first model's route plan).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.admin.http import refuse_unknown_fields
from gateway.auth.admin_access import CALLER_SCOPE_KEY
from gateway.formats.openai_chat import estimate_prompt_tokens, require_object_with_model
from gateway.formats.openai_embeddings import embeddings_estimate, validate_embeddings_request
from gateway.http.request import HttpRequest
from gateway.ingress.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from gateway.steering.labels import client_metadata
from schemas import (
    GatewayError,
    HealthReport,
    HealthRequest,
    InvalidRequestError,
    RoutePlan,
    subjects,
)

if TYPE_CHECKING:
    from bus import Bus
    from gateway.auth.gate import Authenticator
    from gateway.ingress.plan_walk import Ask, PlanWalk
    from gateway.ingress.request_info import RequestInfo
    from gateway.steering.resolver import Resolution
    from schemas.config import ModelConfig

PATH = "/admin/routing/explain"
_SURFACES: dict[str, Surface | None] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/embeddings": None,
}
_MAX_BYTES = 4 * 1024 * 1024
_SPEC_FIELDS = frozenset({"path", "body", "headers"})


class Walker(Protocol):
    """The live path's target resolution (``Targeting.walk``)."""

    def __call__(
        self, requested: str, req: HttpRequest, info: RequestInfo, ask: Ask, *, body: Any
    ) -> Awaitable[PlanWalk]: ...


Rules = Callable[[str, Any, HttpRequest, "RequestInfo"], Awaitable[list[dict[str, Any]]]]
Planner = Callable[["ModelConfig", Any, str, HttpRequest, "RequestInfo"], Awaitable[RoutePlan]]


async def explain(
    req: HttpRequest,
    bus: Bus,
    auth: Authenticator,
    *,
    info_of: Callable[[HttpRequest, str, bool], RequestInfo],
    walk: Walker,
    plan: Planner,
    rules: Rules | None = None,
) -> dict[str, Any]:
    """The dry-run decision for the request described by ``req``'s body. Raises
    InvalidRequestError for a malformed description, and what the live path raises (400 for
    an unknown chain, 404 for an unknown model, ...)."""
    spec = _spec(await req.body(_MAX_BYTES))
    path = spec.get("path", "/v1/chat/completions")
    if not isinstance(path, str) or path not in _SURFACES:
        raise InvalidRequestError(f"'path' must be one of {', '.join(_SURFACES)}", param="path")
    surface = _SURFACES[path]
    raw = spec.get("body")
    if not isinstance(raw, dict):
        raise InvalidRequestError("'body' must be the request body, a JSON object", param="body")
    body = surface.to_canonical(raw) if surface is not None else validate_embeddings_request(raw)
    requested: str = require_object_with_model(body)["model"]
    as_caller = await _as_caller(req, spec.get("headers"), path, auth)
    client_metadata(as_caller)  # as the live path: refused whatever the model
    info = info_of(
        as_caller, "embeddings" if surface is None else surface.name, bool(body.get("stream"))
    )
    # The live path estimates from the body's length (the body re-encoded is that length),
    # an embeddings request's from its inputs.
    info.prompt_estimate = (
        embeddings_estimate(body)
        if surface is None
        else estimate_prompt_tokens(len(msgspec.json.encode(raw)), raw)
    )
    refused: list[dict[str, str]] = []

    async def ask(model: ModelConfig) -> RoutePlan:
        try:
            return await plan(
                model, body, "embeddings" if surface is None else surface.name, as_caller, info
            )
        except GatewayError as err:
            refused.append({"model": model.id, "reason": err.code.value, "message": err.message})
            raise

    walked = await walk(requested, as_caller, info, ask, body=body)
    first = await walked.first()
    return {
        "model_field": requested,
        "target": _target(walked.steered, requested),
        "rules": await rules(requested, body, as_caller, info) if rules else [],
        **(await _scores(walked.steered, bus)),
        "refused": refused,
        "plan": {
            "model": first.model,
            "reason": first.reason,
            "pinned": first.pinned,
            "candidates": [
                {
                    "endpoint": c.endpoint,
                    "kind": c.kind,
                    "upstream_model": c.upstream_model,
                    "credential_id": c.credential_id,
                    "probe": c.probe,
                }
                for c in first.candidates
            ],
            "skipped": [msgspec.structs.asdict(k) for k in first.skipped],
            **(
                {"routewise": [msgspec.structs.asdict(c) for c in first.routewise]}
                if first.routewise
                else {}
            ),
        },
    }


def _spec(raw: bytes) -> dict[str, Any]:
    try:
        spec = msgspec.json.decode(raw) if raw.strip() else None
    except msgspec.DecodeError:
        raise InvalidRequestError("the request body is not valid JSON") from None
    except RecursionError:
        raise InvalidRequestError("the request body is JSON nested too deeply") from None
    if not isinstance(spec, dict):
        raise InvalidRequestError("the body must be {path?, body, headers?}")
    refuse_unknown_fields(spec, _SPEC_FIELDS, f"POST {PATH}")
    return spec


async def _as_caller(req: HttpRequest, headers: Any, path: str, auth: Authenticator) -> HttpRequest:
    """A request carrying the described caller's headers, identified like the live path."""
    if headers is None:
        headers = {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidRequestError("'headers' must be an object of strings", param="headers")
    try:
        # As a live client sends them: ASCII names, values in UTF-8 (a label may be any text).
        described = [(str(k).lower().encode("ascii"), v.encode()) for k, v in headers.items()]
    except UnicodeError:
        raise InvalidRequestError(
            "'headers' names must be ASCII and values text", param="headers"
        ) from None
    scope = {**req.scope, "path": path, "headers": described}
    asking = scope.pop(CALLER_SCOPE_KEY, None)
    fake = HttpRequest(scope, req.receive, req.send)
    if asking is not None and fake.bearer_token() is None and await auth.auth_on():
        # No credential described, where the live path would refuse one: answer as the
        # admin asking (a dashboard session has no key to describe).
        fake.scope[CALLER_SCOPE_KEY] = asking
        return fake
    await auth.gate(fake)
    return fake


def _target(res: Resolution | None, requested: str) -> dict[str, Any]:
    if res is None:
        return {"kind": "model", "model": requested}
    o = res.ordering
    return {
        "kind": res.kind,
        "name": res.target,
        "chain": res.chain,
        "axis": res.axis,
        "ordering": o.how,
        "weights": list(o.weights) if o.weights else None,
        "affinity": res.affinity,
        **({"rule": res.rule} if res.rule else {}),
    }


async def _scores(res: Resolution | None, bus: Bus) -> dict[str, Any]:
    if res is None:
        return {"candidates": [], "excluded": [], "order": []}
    reasons = (
        await _unhealthy_reasons(bus) if any(not c.healthy for c in res.ordering.candidates) else {}
    )
    cands = [
        {
            "model": c.model,
            "scores": {"capability": c.capability, "speed": c.speed, "reliability": c.reliability},
            "multipliers": {"allowance": c.allowance, "rate_limit": c.rate_limit},
            "score": c.score,
            "healthy": c.healthy,
            "allowance_used": c.allowance_used,
            **(
                {"deferred": reasons.get(c.model, "no route can serve now")}
                if not c.healthy
                else {}
            ),
        }
        for c in res.ordering.candidates
    ]
    return {
        "candidates": cands,
        "excluded": [{"model": m, "reason": why} for m, why in res.excluded],
        "order": list(res.models),
        "exploration": res.exploration,
        "degraded": res.degraded,
    }


async def _unhealthy_reasons(bus: Bus) -> dict[str, str]:
    """Why each model with no usable route cannot serve (circuit open, benched)."""
    try:
        report = await bus.request(
            subjects.HEALTH_DEEP, HealthRequest(), reply_type=HealthReport, timeout=2.0
        )
    except GatewayError:
        return {}
    if not isinstance(report, HealthReport):
        return {}
    out: dict[str, str] = {}
    for st in report.endpoints:
        why = "benched" if st.benched_until else f"circuit {st.circuit_state}"
        out.setdefault(st.model, why)
    return out
