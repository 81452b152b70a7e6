"""``fixed``: weighted random selection (the spec's FixedRouter draw)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from actors.strategies import register_strategy
from actors.strategies.base import RouteView, StrategyParams
from schemas import Observation, RouteRequest


class FixedParams(StrategyParams):
    """``fixed`` takes no parameters (the spec's ``local_fraction`` belongs to the manager)."""

    local_fraction: float | None = None


class FixedStrategy:
    """Draw one route with probability proportional to its weight."""

    def __init__(self, params: FixedParams, rng: random.Random | None = None) -> None:
        self.params = params
        self._rng = rng or random.Random()

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """One weighted draw; weights are renormalised over what is admissible."""
        if len(routes) == 1:
            return routes[0]
        total = sum(r.weight for r in routes)
        x = self._rng.random() * total
        for r in routes:
            x -= r.weight
            if x < 0:
                return r
        return routes[-1]

    def observe(self, observation: Observation) -> None:
        """Stateless: nothing to learn."""


register_strategy("fixed", FixedParams)(FixedStrategy)
