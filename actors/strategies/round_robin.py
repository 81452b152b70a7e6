"""``round_robin``: the worked example of adding a strategy (see docs/strategies.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.strategies import register_strategy
from actors.strategies.base import RouteView, RoutingStrategy, StrategyDeps, StrategyParams

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas import Observation, RouteRequest


class RoundRobinParams(StrategyParams):
    """Parameters accepted under ``router_params:`` for ``round_robin``."""

    start: int = 0


class RoundRobinStrategy(RoutingStrategy):
    """Cycle through admissible routes in declaration order, ignoring weights."""

    session_affinity = False  # every request advances the cycle, whoever sends it

    def __init__(self, params: RoundRobinParams, deps: StrategyDeps) -> None:
        self._cursor = params.start

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """The next route after the last one picked, wrapping around."""
        for r in routes:
            if r.index >= self._cursor:
                self._cursor = r.index + 1
                return r
        self._cursor = routes[0].index + 1
        return routes[0]

    def observe(self, observation: Observation) -> None:
        """Stateless: nothing to learn."""


register_strategy("round_robin", RoundRobinParams)(RoundRobinStrategy)
