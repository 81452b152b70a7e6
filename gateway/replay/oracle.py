"""The oracle: what the providers allow a router at best, computed from the providers file.

Each route sustains a request rate: its rate limit (requests, and tokens at the trace's mean
tokens per request, per window) and its capacity by Little's law (slots over the mean time a
request holds one). The trace's mean demand is filled in order of unloaded mean TTFT (the
TTFT bound) and of cost per request at the config's prices (the cost bound). Queueing and
bursts are ignored, so both are bounds no router reaches, not targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    rate: float  # requests per second it sustains
    cost: float  # USD of one mean request


@dataclass(frozen=True, slots=True)
class Oracle:
    """Mean TTFT of the fastest fill and total cost of the cheapest fill of the trace (None
    when the routes cannot carry the demand at all)."""

    ttft_mean: float | None
    cost_usd: float | None
    demand_rps: float

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, rounded like the report."""
        return {
            "ttft_mean": None if self.ttft_mean is None else round(self.ttft_mean, 6),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "demand_rps": round(self.demand_rps, 6),
        }


def oracle_for(
    config: GatewayConfig, providers: ProvidersFile, trace: Sequence[TraceRequest]
) -> Oracle:
    """The bounds for ``trace`` over the routes of ``config`` the providers file describes."""
    if not trace:
        return Oracle(None, None, 0.0)
    n = len(trace)
    span = max(max(r.t for r in trace), 1.0)
    demand = n / span
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
            rate = _rate(p, ttft + generation, prompt + output)
            routes.append(_Route(eid, ttft + whole * generation, rate, cost))
    fastest = _fill(sorted(routes, key=lambda r: (r.ttft, r.endpoint)), demand)
    cheapest = _fill(sorted(routes, key=lambda r: (r.cost, r.endpoint)), demand)
    return Oracle(
        None if fastest is None else sum(s * r.ttft for r, s in fastest) / demand,
        None if cheapest is None else sum(s * r.cost for r, s in cheapest) / demand * n,
        demand,
    )


def _mean_ttft(p: Provider, prompt: float) -> float:
    """The lognormal's mean at the trace's mean prompt."""
    median = p.ttft.median + p.ttft.per_1k_prompt * prompt / 1000.0
    return median * math.exp(p.ttft.sigma**2 / 2)


def _rate(p: Provider, holding: float, tokens: float) -> float:
    """Requests per second ``p`` sustains (inf: unlimited)."""
    rate = math.inf
    if p.capacity is not None:
        rate = min(rate, p.capacity / holding)
    limit = p.rate_limit
    if limit is not None and limit.requests is not None:
        rate = min(rate, limit.requests / limit.per_seconds)
    if limit is not None and limit.tokens is not None:
        rate = min(rate, limit.tokens / limit.per_seconds / tokens)
    return rate


def _fill(ordered: list[_Route], demand: float) -> list[tuple[_Route, float]] | None:
    """Assign ``demand`` (requests/s) to routes in order up to each one's rate."""
    left, out = demand, []
    for r in ordered:
        take = min(left, r.rate)
        if take > 0:
            out.append((r, take))
            left -= take
        if left <= 1e-12:
            return out
    return None
