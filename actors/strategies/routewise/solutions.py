"""The LP solutions of one RouteWise strategy and the fallback orders made of them.

:class:`Solutions` caches each LP solution under :func:`~.solver.lp_key` (its inputs cut to
steps under 0.4 %), least recently used first out, and memoises each fallback order (the LP
re-solved without the routes already placed, once per placed route) under the key of its
first solve, or under a name its caller gives that fixes the same inputs' keys (RouteWise's
order after a select: the select's key, its pick and its rows). A memoised order is answered
only while every solution it was made of is still the one cached under its key and every tie
it broke (routes of equal weight, told apart by their exact latencies, which the key rounds)
still breaks the same way; answering it touches those solutions in the order the re-solves
would have: the cache ends in the state the re-solves would have left, so an answer from the
memo is the answer, and the cache the state, of solving again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from actors.strategies.routewise.solver import budget_for, lp_key, solve_hull, tiebroken

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

LP_CACHE_SIZE = 256
# Fallbacks placed by re-solving the LP; the rest follow by (latency, cost).
RESOLVED_FALLBACKS = 3

_Key = bytes
# A tie one re-solve broke: the positions of equal weight (in the solution's order) and the
# one placed (the first of the fastest).
_Tie = tuple[tuple[int, ...], int]
# The solves of one order, each (its key, the solution cached then), the positions placed,
# the ties broken, and what the caller made of them (``keep``), or None.
_Memo = tuple[
    tuple[tuple[_Key, dict[int, float]], ...],
    tuple[int, ...],
    tuple[_Tie, ...],
    tuple[int, ...] | None,
]


class Solutions:
    """Owns the LP solutions of one strategy at one ``budget_alpha`` and the fallback orders
    made of them (see the module). Raises nothing; the inputs must not be empty."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._lp: OrderedDict[_Key, dict[int, float]] = OrderedDict()
        self._orders: dict[Hashable, _Memo] = {}
        self.last_key: _Key | None = None  # what the last ``weights`` was cached under

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
        """The LP's weights by position in ``costs`` (cached, read only; see the module);
        its key is kept as :attr:`last_key`."""
        key = self.last_key = lp_key(costs, latencies)
        return self._solved(key, costs, latencies)

    def _solved(
        self, key: _Key, costs: Sequence[float], latencies: Sequence[float]
    ) -> dict[int, float]:
        weights = self._lp.get(key)
        if weights is None:
            objective = tiebroken(latencies, costs)
            weights = solve_hull(costs, objective, budget_for(costs, self.alpha, latencies))
            if not weights:  # cannot happen (c_min fits its own budget); stay safe
                weights = {min(range(len(costs)), key=costs.__getitem__): 1.0}
            self._lp[key] = weights
            if len(self._lp) > LP_CACHE_SIZE:
                self._lp.popitem(last=False)
        else:
            self._lp.move_to_end(key)
        return weights

    def key(self, costs: Sequence[float], latencies: Sequence[float]) -> _Key:
        """What the LP over ``costs`` and ``latencies`` is cached under."""
        return lp_key(costs, latencies)

    def order(
        self,
        costs: Sequence[float],
        latencies: Sequence[float],
        name: Hashable = None,
        key: _Key | None = None,
    ) -> list[int]:
        """Up to RESOLVED_FALLBACKS positions of ``costs``, each the heaviest (then fastest)
        of the LP re-solved without the positions before it. Memoised under ``name``, else
        its first solve's key (``key``: that key, when the caller has it already); a
        ``name`` must fix the inputs' keys as that key does (the key itself, or the key of
        the problem they were cut from, with their positions in it)."""
        key = lp_key(costs, latencies) if key is None else key
        name = key if name is None else name
        memo = self._orders.get(name)
        if memo is not None and self._current(memo, lambda: latencies):
            return list(memo[1])
        remaining = list(range(len(costs)))
        # The inputs of the positions remaining, cut down with them.
        sub_costs, sub_lat = list(costs), list(latencies)
        order: list[int] = []
        solves_made: list[tuple[_Key, dict[int, float]]] = []
        ties: list[_Tie] = []
        while remaining and len(order) < RESOLVED_FALLBACKS:
            if order:
                key = lp_key(sub_costs, sub_lat)
            weights = self._solved(key, sub_costs, sub_lat)
            solves_made.append((key, weights))
            if len(weights) == 1:  # one route takes it all (the common case): no tie
                best = next(iter(weights))
            else:
                best = max(weights, key=lambda k: (weights[k], -sub_lat[k]))
                top = weights[best]
                tied = tuple(remaining[k] for k, w in weights.items() if w == top)
                if len(tied) > 1:  # told apart by exact latencies: checked on each answer
                    ties.append((tied, remaining[best]))
            order.append(remaining.pop(best))
            del sub_costs[best], sub_lat[best]
        self._remember(name, (tuple(solves_made), tuple(order), tuple(ties), None))
        return order

    def recall(
        self, name: Hashable, latencies: Callable[[], Sequence[float]]
    ) -> tuple[int, ...] | None:
        """What the caller kept beside the order memoised under ``name``, when that order
        is still the answer for the inputs' exact ``latencies()`` (asked only when the order
        broke a tie; its solutions touched as re-solving would); else None."""
        memo = self._orders.get(name)
        if memo is None or memo[3] is None or not self._current(memo, latencies):
            return None
        return memo[3]

    def keep(self, name: Hashable, made: tuple[int, ...]) -> None:
        """Keep ``made`` beside the order memoised under ``name`` (it must follow from that
        order and ``name`` alone)."""
        memo = self._orders.get(name)
        if memo is not None:
            self._orders[name] = (*memo[:3], made)

    def _current(self, memo: _Memo, latencies: Callable[[], Sequence[float]]) -> bool:
        """Whether every solution ``memo`` was made of is still cached and each of its ties
        breaks as it did at ``latencies()``; if so the solutions are touched in the order the
        re-solves would have touched them."""
        lp = self._lp
        for k, w in memo[0]:
            if lp.get(k) is not w:
                return False
        if memo[2]:
            exact = latencies()
            for tied, placed in memo[2]:
                # max's pick among equal weights: the first (in the solution's order) fastest.
                if max(tied, key=lambda i: -exact[i]) != placed:
                    return False
        for k, _ in memo[0]:
            lp.move_to_end(k)
        return True

    def _remember(self, name: Hashable, memo: _Memo) -> None:
        self._orders[name] = memo
        if len(self._orders) > LP_CACHE_SIZE:
            del self._orders[next(iter(self._orders))]
