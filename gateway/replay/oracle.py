"""The oracle: what the providers allow a router at best, computed from the providers file.

Each route can take a number of the trace's requests: its rate limit (requests, and tokens at
the trace's mean tokens per request, per window) over the trace's span, its capacity and its
concurrency plan by Little's law (slots over the mean time a request holds one), and its
quota plan's allowance in the periods the span reaches; a plan counts once per credential of
the route the provider does not refuse. The TTFT bound fills the fastest
routes (by unloaded mean TTFT) with the requests; the cost bound fills the cheapest ones (at
the config's prices), where a capacity route may also work off a queue until the route's
TTFT timeout after the last arrival (what a config that queues there gets served). Queueing
and bursts are otherwise ignored, so both are bounds no router reaches, not targets.
``cost_unqueued_usd`` is the cheapest fill with no queue at all (each route's slots busy the
whole span, never more): what a cost-first router that keeps TTFT near the SLO aims at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.replay.answers import refused
from schemas.pricing import PER_MILLION

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.replay.providers import Provider, ProvidersFile
    from gateway.replay.trace import TraceRequest
    from schemas.config import GatewayConfig


@dataclass(frozen=True, slots=True)
class _Route:
    endpoint: str
    ttft: float  # mean client TTFT of one request, unloaded
    room: float  # requests of the trace it can take in the trace's span
    room_queued: float  # the same, working off a queue until its TTFT timeout
    cost: float  # USD of one mean request


@dataclass(frozen=True, slots=True)
class Oracle:
    """The bounds for one trace: ``ttft_mean`` of the fastest fill of every request and
    ``cost_usd`` of the cheapest (None when the routes cannot take them all), queueing or
    not (``cost_unqueued_usd``)."""

    routes: tuple[_Route, ...]
    requests: int
    ttft_mean: float | None
    cost_usd: float | None
    cost_unqueued_usd: float | None = None

    def ttft_at(self, served: int) -> float | None:
        """The mean TTFT of the fastest fill of ``served`` requests (None: impossible)."""
        fill = _fill(sorted(self.routes, key=lambda r: (r.ttft, r.endpoint)), served, queued=False)
        return None if fill is None or not served else sum(k * r.ttft for r, k in fill) / served

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, rounded like the report."""
        return {
            "ttft_mean": None if self.ttft_mean is None else round(self.ttft_mean, 6),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "cost_unqueued_usd": _rounded(self.cost_unqueued_usd),
            "requests": self.requests,
        }


def oracle_for(
    config: GatewayConfig, providers: ProvidersFile, trace: Sequence[TraceRequest]
) -> Oracle:
    """The bounds for ``trace`` over the routes of ``config`` the providers file describes."""
    n = len(trace)
    if not n:
        return Oracle((), 0, None, None)
    span = max(max(r.t for r in trace), 1.0)
    prompt = sum(r.prompt_tokens for r in trace) / n
    output = sum(r.output_tokens for r in trace) / n
    whole = sum(1 for r in trace if not r.stream) / n  # non-streams wait for the whole answer
    routes: list[_Route] = []
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            p = providers.for_route(eid, route.base_url)
            if p is None:
                continue
            ttft = _mean_ttft(p, prompt)
            generation = (output - 1) / p.output_tps
            price = route.pricing
            cost = (
                (prompt * price.prompt + output * price.completion) / PER_MILLION if price else 0.0
            )
            holding = ttft + generation
            keys = sum(1 for s in route.secrets or ("",) if not (s and refused(p.refused_keys, s)))
            room = _room(p, holding, prompt + output, span, keys)
            queued = _room(p, holding, prompt + output, span + route.ttft_timeout_seconds, keys)
            routes.append(_Route(eid, ttft + whole * generation, room, min(queued, n), cost))
    fastest = _fill(sorted(routes, key=lambda r: (r.ttft, r.endpoint)), n, queued=False)
    by_cost = sorted(routes, key=lambda r: (r.cost, r.endpoint))
    cheapest = _fill(by_cost, n, queued=True)
    unqueued = _fill(by_cost, n, queued=False)
    return Oracle(
        tuple(routes),
        n,
        None if fastest is None else sum(k * r.ttft for r, k in fastest) / n,
        None if cheapest is None else sum(k * r.cost for r, k in cheapest),
        None if unqueued is None else sum(k * r.cost for r, k in unqueued),
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _mean_ttft(p: Provider, prompt: float) -> float:
    """The lognormal's mean at the trace's mean prompt."""
    median = p.ttft.median + p.ttft.per_1k_prompt * prompt / 1000.0
    return median * math.exp(p.ttft.sigma**2 / 2)


def _room(p: Provider, holding: float, tokens: float, seconds: float, keys: int) -> float:
    """Requests ``p`` can take in ``seconds`` (inf: unlimited) with ``keys`` usable
    credentials; a rate limit's window also admits its allowance at the edge."""
    room = math.inf if keys else 0.0
    if p.capacity is not None:
        room = min(room, p.capacity * seconds / holding)
    if p.concurrency is not None:
        room = min(room, p.concurrency.limit * keys * seconds / holding)
    quota = p.quota
    if quota is not None:
        periods = math.floor(seconds / quota.period_seconds) + 1
        if quota.requests is not None:
            room = min(room, quota.requests * keys * periods)
        if quota.tokens is not None:
            room = min(room, quota.tokens / tokens * keys * periods)
    limit = p.rate_limit
    if limit is not None and limit.requests is not None:
        room = min(room, limit.requests * (seconds / limit.per_seconds + 1))
    if limit is not None and limit.tokens is not None:
        room = min(room, limit.tokens / tokens * (seconds / limit.per_seconds + 1))
    return room


def _fill(ordered: list[_Route], n: float, *, queued: bool) -> list[tuple[_Route, float]] | None:
    """Assign ``n`` requests to routes in order up to each one's room."""
    left, out = n, []
    for r in ordered:
        take = min(left, r.room_queued if queued else r.room)
        if take > 0:
            out.append((r, take))
            left -= take
        if left <= 1e-9:
            return out
    return None
