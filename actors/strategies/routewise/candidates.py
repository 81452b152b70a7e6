"""How one route looks to RouteWise's LP: a :class:`Candidate` with its effective cost
(on-demand: the price of the prompt and the predicted completion; quota: the shadow price of
the pool's used fraction inside the cost envelope; concurrency: nothing while a slot is free)
and its latency (the TTFT profile plus the wait for a slot, :func:`queue_wait_ms`), or why it
is masked. Pure given the evidence and the capacity views the strategy hands in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from llm_routewise.core.cost import scarcity_price

from schemas.pricing import PER_MILLION, uncached_cost

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from actors.strategies.base import RouteView, StrategyDeps
    from actors.strategies.routewise.evidence import LatencyEvidence
    from schemas.config import RouteConfig

# A route at (or past) its learned limit is left out; near it, its queueing is priced as
# if this share of its slots were still free at least.
_MIN_HEADROOM = 0.1
_MAX_RHO = 1.0 - _MIN_HEADROOM


@dataclass(frozen=True, slots=True)
class Candidate:
    """One route as the LP sees it (and as explain / health show it)."""

    endpoint: str
    provider_type: str
    effective_cost: float | None  # None: masked or infeasible
    latency_ms: float
    profiled: bool
    weight: float = 0.0
    quota_used_fraction: float | None = None
    free_slots: float | None = None
    excluded: str = ""  # why it is not in the LP ("" when it is)
    samples: int = 0  # live-window TTFT samples (successes and failures)

    def as_dict(self) -> dict[str, Any]:
        """The row of explain and /health/deep."""
        return {
            "endpoint": self.endpoint,
            "provider_type": self.provider_type,
            "effective_cost_usd": self.effective_cost,
            "latency_ms": self.latency_ms,
            "profiled": self.profiled,
            "lp_weight": self.weight,
            "quota_used_fraction": self.quota_used_fraction,
            "free_slots": self.free_slots,
            "excluded": self.excluded,
            "samples": self.samples,
        }


# One route as the decision prices it: a :class:`Candidate`'s fields up to ``excluded``, in
# their order (``Candidate(*row)``). The hot path keeps rows and builds no Candidate.
Row = tuple[str, str, float | None, float, bool, float, float | None, float | None, str]


def candidate(
    endpoint: str,
    route: RouteConfig,
    prompt_tokens: int,
    predicted: float,
    bounds: tuple[float, float] | None,
    now: float,
    latency_evidence: LatencyEvidence,
    deps: StrategyDeps,
) -> Candidate:
    """How the route ``endpoint`` looks to the LP now (see :func:`route_row`)."""
    return Candidate(
        *route_row(
            endpoint,
            route,
            prompt_tokens,
            round(predicted),
            bounds,
            now,
            latency_evidence,
            deps,
        )
    )


def route_row(
    endpoint: str,
    route: RouteConfig,
    prompt_tokens: int,
    completion_tokens: int,
    bounds: tuple[float, float] | None,
    now: float,
    latency_evidence: LatencyEvidence,
    deps: StrategyDeps,
) -> Row:
    """How the route ``endpoint`` looks to the LP now: its latency (profile plus the wait
    for a slot) and effective cost (``None`` with the reason when masked or infeasible),
    for a prompt of ``prompt_tokens`` and ``completion_tokens`` predicted."""
    return _row(
        endpoint,
        route,
        prompt_tokens,
        completion_tokens,
        bounds,
        latency_evidence.lp_latency(endpoint, now),
        deps.load(endpoint),
        latency_evidence,
        deps,
    )


def _row(
    endpoint: str,
    route: RouteConfig,
    prompt_tokens: int,
    completion_tokens: int,
    bounds: tuple[float, float] | None,
    latency_now: tuple[float, bool],
    load: tuple[int, float | None],
    latency_evidence: LatencyEvidence,
    deps: StrategyDeps,
) -> Row:
    kind = route.provider_type
    latency, profiled = latency_now
    state = deps.capacity(endpoint)
    free = state.free if state is not None else None
    in_flight, limit = load
    if limit is not None:
        if in_flight >= limit:
            return (endpoint, kind, None, latency, profiled, 0.0, None, free, "capacity_full")
        # Queueing: a route holding a share of its learned limit (or slow-start window)
        # makes the next request wait for a slot that often; priced as an M/M/c queue.
        hold = latency_evidence.hold_ms(endpoint)
        latency += queue_wait_ms(in_flight, limit, latency if hold is None else hold)
    if kind == "quota":
        if state is None or not state.resolved:
            return (endpoint, kind, None, latency, profiled, 0.0, None, free, "quota_unresolved")
        fraction = state.used_fraction
        if state.free <= 0:
            why = "quota_exhausted"
            return (endpoint, kind, None, latency, profiled, 0.0, fraction, free, why)
        if bounds is None:
            why = "envelope_uncalibrated"
            return (endpoint, kind, None, latency, profiled, 0.0, fraction, free, why)
        price = scarcity_price("exp_lu", fraction, L=bounds[0], U=bounds[1])
        return (endpoint, kind, price, latency, profiled, 0.0, fraction, free, "")
    if kind == "concurrency":
        if state is not None and state.free <= 0:
            return (endpoint, kind, None, latency, profiled, 0.0, None, free, "concurrency_full")
        return (endpoint, kind, 0.0, latency, profiled, 0.0, None, free, "")
    pricing = route.pricing  # no cache: the cold-cache price of the prompt
    price = 0.0 if pricing is None else uncached_cost(pricing, prompt_tokens, completion_tokens)
    return (endpoint, kind, price, latency, profiled, 0.0, None, free, "")


def route_rows(
    routes: Sequence[RouteView],
    prompt_tokens: int,
    completion_tokens: int,
    bounds: tuple[float, float] | None,
    now: float,
    latency_evidence: LatencyEvidence,
    deps: StrategyDeps,
) -> list[Row]:
    """:func:`route_row` of every route of ``routes``, the same rows in one pass: every
    route's latency read from ``lp_latency``'s cache inline, and an on-demand route with a
    free slot takes its load, its queueing when requests are in flight and its price inline,
    and no capacity look-up (it draws on no pool)."""
    load, holds = deps.load, latency_evidence.holds
    cached, lp_latency, second = latency_evidence.lp_cache, latency_evidence.lp_latency, int(now)
    prompt = prompt_tokens if prompt_tokens > 0 else 0  # as uncached_cost
    completion = completion_tokens if completion_tokens > 0 else 0
    rows: list[Row] = []
    for r in routes:
        endpoint, route = r.endpoint, r.route
        hit = cached.get(endpoint)  # lp_latency's cache, read inline (once per route)
        latency, profiled = (
            hit[1] if hit is not None and hit[0] == second else lp_latency(endpoint, now)
        )
        kind = route.provider_type
        in_flight, limit = load(endpoint)
        if kind != "on_demand" or (limit is not None and in_flight >= limit):
            lp = (latency, profiled)
            args = (prompt_tokens, completion_tokens, bounds, lp, (in_flight, limit))
            rows.append(_row(endpoint, route, *args, latency_evidence, deps))
            continue
        if in_flight and limit is not None:  # none in flight: no wait (it would add 0.0)
            hold = holds.get(endpoint)
            latency += queue_wait_ms(in_flight, limit, latency if hold is None else hold)
        pricing = route.pricing
        price = (
            0.0
            if pricing is None
            else (prompt * pricing.prompt + completion * pricing.completion) / PER_MILLION
        )
        # An on-demand route draws on no capacity pool: no free slots to show.
        rows.append((endpoint, kind, price, latency, profiled, 0.0, None, None, ""))
    return rows


def queue_wait_ms(in_flight: int, slots: float, hold_ms: float) -> float:
    """The mean wait for a slot of a route serving ``in_flight`` of ``slots`` at once, each
    held ``hold_ms``: an M/M/c queue at utilisation ``in_flight / slots`` (Sakasegawa's
    approximation, ``hold * rho^(sqrt(2(c+1)) - 1) / (c (1 - rho))``, with at least
    ``_MIN_HEADROOM`` of the slots taken as free). Near nothing while many slots are free,
    steep as the last ones fill: a route is filled toward its limit, not kept at half of it
    as the squared headroom did; at the limit the route is left out of the LP."""
    c = slots if slots > 1.0 else 1.0  # max(1.0, slots), min(..., _MAX_RHO): no calls
    rho = in_flight / c
    if _MAX_RHO < rho:
        rho = _MAX_RHO
    if rho <= 0.0:
        return 0.0
    return hold_ms * math.pow(rho, math.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho))


def weighted(cands: Sequence[Candidate], weights: Mapping[int, float]) -> list[Candidate]:
    """``cands`` with their LP ``weights`` (by index; 0 for those without)."""
    return [replace(c, weight=weights.get(i, 0.0)) for i, c in enumerate(cands)]
