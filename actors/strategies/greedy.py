"""Baselines for comparing routers (``llmgw replay``): ``greedy_cost`` and ``greedy_latency``.

``greedy_cost`` sends each request to the admissible route that would charge least for it (its
``pricing:`` at the request's prompt estimate and ``output_tokens`` of answer); unpriced
routes count as free. ``greedy_latency`` sends it to the admissible route with the lowest
measured time to first token (an exponentially weighted mean of the successes' TTFT); a route
not measured yet goes first, so each is measured once. Ties keep declaration order. Neither
learns capacity or spreads load: they are the naive ends a real router is measured against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from actors.strategies import register_strategy
from actors.strategies.base import RouteView, RoutingStrategy, StrategyDeps, StrategyParams

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas import Observation, RouteRequest


class GreedyCostParams(StrategyParams):
    """``router_params`` of ``greedy_cost``: the answer length a request is priced at."""

    output_tokens: int = Field(default=256, ge=0)


class GreedyCostStrategy(RoutingStrategy):
    """The cheapest admissible route for each request."""

    session_affinity = False  # the price decides, not the caller

    def __init__(self, params: GreedyCostParams, deps: StrategyDeps) -> None:
        self._output = params.output_tokens

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """The route whose prices charge least for ``request`` (first declared on a tie)."""
        return min(routes, key=lambda r: (self._price(r, request.prompt_tokens), r.index))

    def _price(self, r: RouteView, prompt_tokens: int) -> float:
        p = r.route.pricing
        return 0.0 if p is None else p.prompt * prompt_tokens + p.completion * self._output

    def observe(self, observation: Observation) -> None:
        """Prices are configured: nothing to learn."""


class GreedyLatencyParams(StrategyParams):
    """``router_params`` of ``greedy_latency``: the weight of each new TTFT in the mean."""

    ewma_alpha: float = Field(default=0.2, gt=0, le=1)


class GreedyLatencyStrategy(RoutingStrategy):
    """The admissible route with the lowest measured TTFT (unmeasured ones first)."""

    session_affinity = False

    def __init__(self, params: GreedyLatencyParams, deps: StrategyDeps) -> None:
        self._alpha = params.ewma_alpha
        self._ttft_ms: dict[str, float] = {}  # bounded by the model's routes

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """The fastest measured route; a route never measured first (first declared on a tie)."""
        return min(routes, key=lambda r: (self._ttft_ms.get(r.endpoint, -1.0), r.index))

    def observe(self, observation: Observation) -> None:
        """Fold a success's TTFT into its route's mean."""
        if observation.outcome != "success" or observation.ttft_ms is None:
            return
        seen = self._ttft_ms.get(observation.endpoint)
        ttft = observation.ttft_ms
        self._ttft_ms[observation.endpoint] = (
            ttft if seen is None else seen + self._alpha * (ttft - seen)
        )


register_strategy("greedy_cost", GreedyCostParams)(GreedyCostStrategy)
register_strategy("greedy_latency", GreedyLatencyParams)(GreedyLatencyStrategy)
