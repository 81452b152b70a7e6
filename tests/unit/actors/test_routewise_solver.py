"""The exact O(n log n) LP solver against the library's pair enumeration."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from llm_routewise.core.lp import cost_tiebroken_objective

from actors.strategies.routewise.solver import (
    budget_for,
    solve_hull,
    solve_with_library,
    tiebroken,
)

_cost = st.floats(min_value=0.0, max_value=1.0, allow_nan=False).map(lambda x: round(x, 4))
_lat = st.floats(min_value=1.0, max_value=20_000.0, allow_nan=False).map(lambda x: round(x, 1))


def _value(weights: dict[int, float], xs: list[float]) -> float:
    return sum(w * xs[i] for i, w in weights.items())


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(_cost, _lat), min_size=1, max_size=30),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_hull_solver_matches_the_library_lp_on_random_instances(
    points: list[tuple[float, float]], alpha: float
) -> None:
    costs = [c for c, _ in points]
    objective = cost_tiebroken_objective([lat for _, lat in points], costs)
    budget = budget_for(costs, alpha, [lat for _, lat in points])
    ours = solve_hull(costs, objective, budget)
    theirs = solve_with_library(costs, objective, budget)
    assert bool(ours) == bool(theirs)
    assert abs(sum(ours.values()) - 1.0) < 1e-9
    assert len(ours) <= 2  # the optimum mixes at most two candidates
    assert _value(ours, costs) <= budget + 1e-7
    assert abs(_value(ours, objective) - _value(theirs, objective)) <= 1e-6 * max(
        1.0, abs(_value(theirs, objective))
    )


def test_hull_solver_budget_below_every_cost_is_infeasible() -> None:
    assert solve_hull([0.5, 0.7], [10.0, 5.0], 0.1) == {}


def test_hull_solver_mixes_the_two_hull_vertices_around_the_budget() -> None:
    # cheap-slow (0, 1000), mid (0.5, 900) above the hull, fast-dear (1, 100)
    weights = solve_hull([0.0, 0.5, 1.0], [1000.0, 900.0, 100.0], 0.25)
    assert set(weights) == {0, 2}
    assert abs(weights[2] - 0.25) < 1e-12


def test_budget_runs_from_the_cheapest_route_to_the_fastest_not_to_the_dearest() -> None:
    # cheap-slow, fast, and a dearer route slower than the fast one (a queueing one)
    costs, latencies = [0.1, 0.5, 1.0], [300.0, 100.0, 200.0]
    assert budget_for(costs, 0.0, latencies) == 0.1
    assert budget_for(costs, 1.0, latencies) == 0.5
    # Before: 0.55, above what the fastest choice spends, so alpha 0.5 bought it outright.
    assert abs(budget_for(costs, 0.5, latencies) - 0.3) < 1e-12
    # Equally fast: the cheaper one is the fastest choice.
    assert budget_for([0.1, 0.9, 0.4], 1.0, [300.0, 100.0, 100.0]) == 0.4


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_cost, _lat), min_size=1, max_size=12))
def test_tiebroken_is_the_library_objective_to_the_bit(points: list[tuple[float, float]]) -> None:
    costs = [c for c, _ in points]
    latencies = [lat for _, lat in points]
    assert list(tiebroken(latencies, costs)) == cost_tiebroken_objective(latencies, costs)
