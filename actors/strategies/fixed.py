"""``fixed``: weighted random selection, biased away from endpoints buried in prefill.

Spec "Prefill-aware selection": power of two choices — two independent weighted draws, keep
the one holding less prefill — but only once the heavier draw carries at least
``intervene_tokens``; below that, configured weights decide alone.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from actors.strategies import register_strategy
from actors.strategies.base import RouteView, RoutingStrategy, StrategyDeps, StrategyParams

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas import Observation, RouteRequest


class FixedParams(StrategyParams):
    """``local_fraction``: share of weight for local routes (the weight manager's split)."""

    local_fraction: float | None = None


class FixedStrategy(RoutingStrategy):
    """Weighted draw with the prefill tie-break."""

    def __init__(
        self, params: FixedParams, deps: StrategyDeps, rng: random.Random | None = None
    ) -> None:
        self.params = params
        self._prefill = deps.prefill
        self._rng = rng or deps.rng or random.Random()

    def _draw(self, routes: Sequence[RouteView]) -> RouteView:
        total = sum(r.weight for r in routes)
        x = self._rng.random() * total
        for r in routes:
            x -= r.weight
            if x < 0:
                return r
        return routes[-1]

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """One weighted draw, or the lighter of two when prefill pressure says so."""
        if len(routes) == 1:
            return routes[0]
        first = self._draw(routes)
        if not self._prefill.enabled:
            return first
        second = self._draw(routes)
        if second.endpoint == first.endpoint:
            return first
        heavier, lighter = (first, second) if first.backlog >= second.backlog else (second, first)
        if heavier.backlog >= self._prefill.intervene_tokens and lighter.backlog < heavier.backlog:
            return lighter
        return first

    def observe(self, observation: Observation) -> None:
        """Stateless: nothing to learn."""


register_strategy("fixed", FixedParams)(FixedStrategy)
