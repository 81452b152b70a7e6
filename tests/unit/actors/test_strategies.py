"""The strategy registry, one contract every registered strategy passes, and the
behaviours of ``fixed`` and ``round_robin``."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from actors.strategies import (
    RouteView,
    StrategyDeps,
    build_strategy,
    known_strategies,
    register_missing_strategy,
    validate_strategy,
)
from actors.strategies.fixed import FixedParams, FixedStrategy
from schemas import Observation, RouteRequest
from schemas.config import PrefillConfig, RouteConfig

ROUTE = RouteConfig(kind="echo")
REQ = RouteRequest(model="m")


def _views(*weights: float, backlog: tuple[int, ...] = ()) -> list[RouteView]:
    return [
        RouteView(i, f"m:e{i}", w, ROUTE, backlog[i] if backlog else 0)
        for i, w in enumerate(weights)
    ]


@pytest.mark.parametrize("name", known_strategies())
class TestEveryStrategy:
    """The contract: what the ModelActor relies on from any strategy."""

    def test_select_returns_one_of_the_given_routes(self, name: str) -> None:
        s = build_strategy(name, {})
        routes = _views(1, 2, 3)
        for _ in range(50):
            assert s.select(routes, REQ) in routes

    def test_select_with_one_route_returns_it(self, name: str) -> None:
        only = _views(1)
        assert build_strategy(name, {}).select(only, REQ) is only[0]

    def test_select_with_a_changing_route_set_never_returns_a_stale_route(self, name: str) -> None:
        s = build_strategy(name, {})
        s.select(_views(1, 1, 1), REQ)
        fewer = _views(1, 1)
        assert s.select(fewer, REQ) in fewer

    def test_observe_accepts_every_outcome(self, name: str) -> None:
        s = build_strategy(name, {})
        for outcome in ("success", "failure", "client_error", "cancelled"):
            s.observe(Observation(endpoint="m:e0", model="m", outcome=outcome))

    def test_unknown_router_param_is_refused(self, name: str) -> None:
        with pytest.raises(ValueError, match="router_params"):
            validate_strategy(name, {"definitely_not_a_param": 1})


def test_registry_unknown_name_lists_known_names() -> None:
    with pytest.raises(
        ValueError, match="known routers: fixed, greedy_cost, greedy_latency, round_robin"
    ):
        validate_strategy("fastest", {})


def test_registry_missing_strategy_fails_with_its_reason() -> None:
    register_missing_strategy("needs_numpy_9", "numpy 9 is not installed")
    with pytest.raises(ValueError, match="numpy 9 is not installed"):
        validate_strategy("needs_numpy_9", {})


def test_fixed_draw_follows_weights() -> None:
    s = FixedStrategy(
        FixedParams(), StrategyDeps(PrefillConfig(enabled=False)), rng=random.Random(7)
    )
    counts = Counter(s.select(_views(3, 1), REQ).endpoint for _ in range(4000))
    # 3:1 -> 3000 expected; 4 sigma of a binomial(4000, .75) is about 110.
    assert abs(counts["m:e0"] - 3000) < 110


def test_fixed_prefill_tiebreak_below_threshold_leaves_weights_alone() -> None:
    prefill = PrefillConfig(intervene_tokens=50_000)
    s = FixedStrategy(FixedParams(), StrategyDeps(prefill), rng=random.Random(1))
    routes = _views(1, 1, backlog=(49_999, 0))
    counts = Counter(s.select(routes, REQ).endpoint for _ in range(2000))
    assert abs(counts["m:e0"] - 1000) < 150


def test_fixed_prefill_tiebreak_above_threshold_avoids_the_loaded_endpoint() -> None:
    prefill = PrefillConfig(intervene_tokens=50_000)
    s = FixedStrategy(FixedParams(), StrategyDeps(prefill), rng=random.Random(1))
    routes = _views(1, 1, backlog=(50_000, 0))
    counts = Counter(s.select(routes, REQ).endpoint for _ in range(2000))
    # Only when both draws land on e0 (p = 1/4) is it chosen.
    assert abs(counts["m:e0"] - 500) < 120


def test_round_robin_cycles_in_declaration_order() -> None:
    s = build_strategy("round_robin", {})
    routes = _views(1, 5, 1)
    assert [s.select(routes, REQ).index for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def _priced(*prices: tuple[float, float]) -> list[RouteView]:
    return [
        RouteView(
            i, f"m:e{i}", 1.0, RouteConfig(kind="echo", pricing={"prompt": p, "completion": c})
        )
        for i, (p, c) in enumerate(prices)
    ]


def test_greedy_cost_picks_the_route_cheapest_for_the_requests_prompt() -> None:
    s = build_strategy("greedy_cost", {"output_tokens": 100})
    routes = _priced((1.0, 10.0), (3.0, 2.0), (1.0, 10.0))
    # 10 prompt tokens: 10 + 1000 against 30 + 200; 10,000: 10,000 + 1,000 against 30,000 + 200.
    assert s.select(routes, RouteRequest(model="m", prompt_tokens=10)) is routes[1]
    assert s.select(routes, RouteRequest(model="m", prompt_tokens=10_000)) is routes[0]


def test_greedy_latency_measures_each_route_once_then_takes_the_fastest() -> None:
    s = build_strategy("greedy_latency", {"ewma_alpha": 0.5})
    routes = _views(1, 1, 1)
    for i, ttft in enumerate((300.0, 100.0, 200.0)):
        assert s.select(routes, REQ) is routes[i]  # the first not measured yet
        s.observe(Observation(endpoint=f"m:e{i}", model="m", outcome="success", ttft_ms=ttft))
    assert s.select(routes, REQ) is routes[1]
    # e1 slows: its mean moves halfway each time (100 -> 350 -> 475), e2 is then the fastest.
    for _ in range(2):
        s.observe(Observation(endpoint="m:e1", model="m", outcome="success", ttft_ms=600.0))
    s.observe(Observation(endpoint="m:e2", model="m", outcome="failure", ttft_ms=1.0))
    assert s.select(routes, REQ) is routes[2]
