"""The LP solutions of one RouteWise strategy and the fallback orders made of them.

:class:`Solutions` caches each LP solution under :func:`~.solver.lp_key` (its inputs cut to
steps under 0.4 %), least recently used first out, and memoises each fallback order (the LP
re-solved without the routes already placed, once per placed route) under the key of its
first solve. A memoised order is answered only while every solution it was made of is still
the one cached under its key, and answering it touches those solutions in the order the
re-solves would have: the cache ends in the state the re-solves would have left, so an
answer from the memo is the answer, and the cache the state, of solving again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from llm_routewise.core.lp import cost_tiebroken_objective

from actors.strategies.routewise.solver import budget_for, lp_key, solve

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

LP_CACHE_SIZE = 256
# Fallbacks placed by re-solving the LP; the rest follow by (latency, cost).
RESOLVED_FALLBACKS = 3

_Key = tuple[float, int, int]
# The solves of one order, each (its key, the solution cached then), and the positions placed.
# ... and what the caller made of them (``keep``), or None.
_Memo = tuple[tuple[tuple[_Key, dict[int, float]], ...], tuple[int, ...], tuple[int, ...] | None]


class Solutions:
    """Owns the LP solutions of one strategy at one ``budget_alpha`` and the fallback orders
    made of them (see the module). Raises nothing; the inputs must not be empty."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._lp: OrderedDict[_Key, dict[int, float]] = OrderedDict()
        self._orders: dict[Hashable, _Memo] = {}

    def __len__(self) -> int:
        return len(self._lp)

    def cached(self) -> list[tuple[_Key, dict[int, float]]]:
        """Every cached solution with its key, least recently used first."""
        return list(self._lp.items())

    def retune(self, alpha: float) -> None:
        """Forget every solution and order; solve at ``alpha`` from now on."""
        self.alpha = alpha
        self._lp.clear()
        self._orders.clear()

    def weights(self, costs: Sequence[float], latencies: Sequence[float]) -> dict[int, float]:
        """The LP's weights by position in ``costs`` (cached; see the module)."""
        return self.keyed(costs, latencies)[1]

    def keyed(
        self, costs: Sequence[float], latencies: Sequence[float]
    ) -> tuple[Hashable, dict[int, float]]:
        """The LP's weights by position in ``costs``, and the key they are cached under."""
        key = lp_key(self.alpha, costs, latencies)
        return key, self._solved(key, costs, latencies)

    def _solved(
        self, key: _Key, costs: Sequence[float], latencies: Sequence[float]
    ) -> dict[int, float]:
        weights = self._lp.get(key)
        if weights is None:
            objective = cost_tiebroken_objective(latencies, costs)
            weights = solve(costs, objective, budget_for(costs, self.alpha, latencies))
            if not weights:  # cannot happen (c_min fits its own budget); stay safe
                weights = {min(range(len(costs)), key=costs.__getitem__): 1.0}
            self._lp[key] = weights
            if len(self._lp) > LP_CACHE_SIZE:
                self._lp.popitem(last=False)
        else:
            self._lp.move_to_end(key)
        return weights

    def order(
        self, costs: Sequence[float], latencies: Sequence[float], name: Hashable = None
    ) -> list[int]:
        """Up to RESOLVED_FALLBACKS positions of ``costs``, each the heaviest (then fastest)
        of the LP re-solved without the positions before it. Memoised under ``name``, else
        its first solve's key; a ``name`` must fix the inputs' keys as that key does (the
        key of the problem they were cut from, with their positions in it)."""
        key = lp_key(self.alpha, costs, latencies) if name is None else None
        name = key if name is None else name
        memo = self._orders.get(name)
        if memo is not None:
            if self._current(memo):
                return list(memo[1])
        remaining = list(range(len(costs)))
        order: list[int] = []
        solves_made: list[tuple[_Key, dict[int, float]]] = []
        tied = False
        while remaining and len(order) < RESOLVED_FALLBACKS:
            sub_costs = [costs[i] for i in remaining]
            sub_lat = [latencies[i] for i in remaining]
            if order or key is None:
                key = lp_key(self.alpha, sub_costs, sub_lat)
            weights = self._solved(key, sub_costs, sub_lat)
            solves_made.append((key, weights))
            if len(weights) == 1:  # one route takes it all (the common case): no tie
                best = next(iter(weights))
            else:
                best = max(weights, key=lambda k: (weights[k], -sub_lat[k]))
                # Equal weights are told apart by exact latencies, which the key rounds:
                # such an order is not memoised.
                tied = tied or sum(w == weights[best] for w in weights.values()) > 1
            order.append(remaining.pop(best))
        if not tied:
            self._remember(name, (tuple(solves_made), tuple(order), None))
        return order

    def recall(self, name: Hashable) -> tuple[int, ...] | None:
        """What the caller kept beside the order memoised under ``name``, when that order
        is still the answer (its solutions touched as re-solving would); else None."""
        memo = self._orders.get(name)
        if memo is None or memo[2] is None or not self._current(memo):
            return None
        return memo[2]

    def keep(self, name: Hashable, made: tuple[int, ...]) -> None:
        """Keep ``made`` beside the order memoised under ``name`` (it must follow from that
        order and ``name`` alone)."""
        memo = self._orders.get(name)
        if memo is not None:
            self._orders[name] = (memo[0], memo[1], made)

    def _current(self, memo: _Memo) -> bool:
        """Whether every solution ``memo`` was made of is still cached; if so they are
        touched in the order the re-solves would have touched them."""
        lp = self._lp
        if not all(lp.get(k) is w for k, w in memo[0]):
            return False
        for k, _ in memo[0]:
            lp.move_to_end(k)
        return True

    def _remember(self, name: Hashable, memo: _Memo) -> None:
        self._orders[name] = memo
        if len(self._orders) > LP_CACHE_SIZE:
            del self._orders[next(iter(self._orders))]
