"""RouteWise's cached LP solutions and memoised fallback orders: a memoised order is the
order re-solving gives, and leaves the cache as re-solving would; an input moving past the
cache's tolerance, a retune or a route leaving the LP changes it."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

from actors.strategies.routewise import solutions
from actors.strategies.routewise.solutions import RESOLVED_FALLBACKS, Solutions
from actors.strategies.routewise.solver import lp_key
from schemas import RouteRequest
from schemas.capacity import CapacityState
from tests.unit.actors.test_routewise import (
    CHEAP,
    DEAR,
    make,
    pool_state,
    quota_route,
    route,
    ttft,
)

if TYPE_CHECKING:
    from tests.unit.actors import FakeClock


def resolved(solutions: Solutions, costs: list[float], latencies: list[float]) -> list[int]:
    """The fallback order by re-solving the LP once per placed route, as before the memo."""
    remaining, order = list(range(len(costs))), list[int]()
    while remaining and len(order) < RESOLVED_FALLBACKS:
        sub_lat = [latencies[i] for i in remaining]
        weights = solutions.weights([costs[i] for i in remaining], sub_lat)
        best = max(weights, key=lambda k: (weights[k], -sub_lat[k]))
        order.append(remaining.pop(best))
    return order


def test_a_memoised_order_is_what_resolving_gives_and_leaves_the_same_cache() -> None:
    rng = random.Random(11)
    memo, fresh = Solutions(0.5), Solutions(0.5)
    # A few shapes jittered inside and past the tolerance: orders repeat (memo answers),
    # keys outnumber the cache (solutions are evicted under memoised orders) and some
    # mixes are even (equal weights, told apart by exact latency).
    shapes = [
        ([1.0, 2.0, 5.0, 9.0], [900.0, 400.0, 300.0, 100.0]),
        ([1.0, 3.0, 3.0, 5.0, 8.0], [500.0, 200.0, 210.0, 150.0, 90.0]),
        ([2.0, 4.0], [300.0, 100.0]),  # alpha 0.5: a 50/50 mix
        ([1.0, 1.0, 6.0], [250.0, 250.0, 50.0]),
    ]
    hits = 0
    for _ in range(6000):
        costs, lat = rng.choice(shapes)
        jitter = rng.choice((0.0, 1e-4, 2e-3, 3e-2))
        c = [x * (1 + rng.uniform(-jitter, jitter)) for x in costs]
        ms = [x * (1 + rng.uniform(-jitter, jitter)) for x in lat]
        before = len(memo)
        assert memo.order(c, ms) == resolved(fresh, c, ms)
        assert memo.cached() == fresh.cached()
        hits += len(memo) == before
    assert hits > 3000  # the memo answered most of them


def test_an_even_mix_is_answered_from_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routes priced in exact multiples (as the request-cost benchmark's five) put the budget
    on even mixes, two routes of equal weight told apart by exact latency; such an order is
    memoised too (its tie checked again on each answer), not re-solved for every request."""
    costs, lat = [2.0, 4.0, 3.0], [300.0, 100.0, 500.0]
    expected = resolved(Solutions(0.5), costs, lat)
    s = Solutions(0.5)
    assert sorted(s.weights(costs, lat).values()) == [0.5, 0.5]  # the first solve ties
    assert s.order(costs, lat) == expected == [1, 0, 2]
    keys: list[object] = []

    def counted(*args: Any) -> object:
        keys.append(args)
        return lp_key(*args)

    monkeypatch.setattr(solutions, "lp_key", counted)
    for _ in range(3):
        assert s.order(costs, lat) == expected
    assert len(keys) == 3  # each answer keys its problem once; nothing is re-solved


def test_fallback_order_moves_when_a_latency_moves_past_the_tolerance(clock: FakeClock) -> None:
    s, views = make(
        clock,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        route(8003, pricing={"prompt": 1.0, "completion": 5.0}),
        budget_alpha=1.0,
        latency_fast_half_life_sec=0.0,
    )
    a, b, c = (v.endpoint for v in views)
    ttft(s, a, 3000.0, clock, n=20)
    ttft(s, b, 400.0, clock, n=20)
    ttft(s, c, 402.0, clock, n=20)
    req = RouteRequest(model="m", prompt_tokens=1000)

    def order() -> list[str]:
        return [v.endpoint for v in s.fallback_order(views, req)]

    assert order() == [b, c, a]
    assert order() == [b, c, a]  # answered from the memo
    # One slow answer moves b's mean from 400 to 403.5 ms (0.9 %), past c's 402.
    clock.now += 1.0
    ttft(s, b, 473.5, clock, n=1)
    assert s.latency.lp_latency(b, clock.now)[0] == pytest.approx(403.5)
    assert order() == [c, b, a]
    # Retuned to the cheapest mix, the same inputs order by cost.
    s.retune(s.params.model_copy(update={"budget_alpha": 0.0}))
    assert order() == [a, c, b]


def test_fallback_order_puts_a_route_that_left_the_lp_last(clock: FakeClock) -> None:
    conc = route(8002, provider_type="concurrency", concurrency={"limit": 2})
    mid = route(8003, pricing={"prompt": 1.0, "completion": 5.0})
    s, views = make(clock, route(8001, pricing=CHEAP), conc, mid, budget_alpha=1.0)
    a, b, c = (v.endpoint for v in views)
    ttft(s, a, 3000.0, clock)
    ttft(s, b, 100.0, clock)
    ttft(s, c, 800.0, clock)
    req = RouteRequest(model="m", prompt_tokens=1000)
    pool_state(s, CapacityState(pool=b, kind="concurrency", limit=2, used=1))
    assert [v.endpoint for v in s.fallback_order(views, req)] == [b, c, a]
    pool_state(s, CapacityState(pool=b, kind="concurrency", limit=2, used=2))
    assert [v.endpoint for v in s.fallback_order(views, req)] == [c, a, b]


@pytest.mark.parametrize("after_select", [False, True])
def test_select_then_fallback_order_decide_as_resolving_does(
    clock: FakeClock, after_select: bool
) -> None:
    """Whether the rest is priced again or named after the select's LP and its pick (what
    the planner asks, ``after_select``), its order is the LP re-solved, and the cache the
    same as re-solving leaves it."""
    prices = [CHEAP, DEAR, {"prompt": 1.0, "completion": 5.0}, {"prompt": 0.5, "completion": 2}]
    twins = [
        make(clock, *(route(8001 + i, pricing=p) for i, p in enumerate(prices)), random_seed=5)
        for _ in range(2)
    ]
    (s, views), (ref, _) = twins
    rng = random.Random(3)
    # The dearer the faster: the LP mixes two routes, so either can be the primary.
    base = dict(zip((v.endpoint for v in views), (800.0, 200.0, 400.0, 600.0), strict=True))
    for v in views:
        for strategy, _ in twins:
            ttft(strategy, v.endpoint, base[v.endpoint], clock, n=10)
    primaries: set[str] = set()
    for _ in range(400):
        req = RouteRequest(model="m", prompt_tokens=1000)
        primary = s.select(views, req)
        assert ref.select(views, req) == primary
        rest = [v for v in views if v is not primary]
        cands = ref.candidates(rest, req, clock.now)
        costs = [c.effective_cost or 0.0 for c in cands]
        placed = resolved(ref._solutions, costs, [c.latency_ms for c in cands])
        tail = sorted(set(range(len(rest))) - set(placed), key=lambda i: cands[i].latency_ms)
        assert [v.endpoint for v in s.fallback_order(rest, req, after_select=after_select)] == [
            rest[i].endpoint for i in (*placed, *tail)
        ]
        assert s._solutions.cached() == ref._solutions.cached()
        # Latencies move inside the tolerance mostly, past it now and then.
        clock.now += 0.25
        ms = base[primary.endpoint] * (1 + rng.choice((0.001, -0.001, 0.05, -0.05)))
        for strategy, _ in twins:
            ttft(strategy, primary.endpoint, ms, clock, n=1)
        primaries.add(primary.endpoint)
    assert len(primaries) >= 2


@pytest.mark.parametrize("counts", [(4, 5), (5, 4)])
def test_an_order_memoised_after_a_select_holds_for_its_number_of_routes(
    clock: FakeClock, counts: tuple[int, int]
) -> None:
    """Masked routes (quota routes whose pool has not resolved) go last, so the same LP and
    pick with one masked route more or less is another order: the one re-solving gives,
    never the memo of the other count's."""
    s, views = make(
        clock,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        route(8003, pricing={"prompt": 1.0, "completion": 5.0}),
        quota_route(8004),
        quota_route(8005),
        budget_alpha=0.0,
    )
    for v, ms in zip(views, (800.0, 200.0, 400.0, 300.0, 300.0), strict=True):
        ttft(s, v.endpoint, ms, clock, n=10)
    for n in counts:
        req = RouteRequest(model="m", prompt_tokens=1000)
        primary = s.select(views[:n], req)
        rest = [v for v in views[:n] if v is not primary]
        again = RouteRequest(model="m", prompt_tokens=1000)  # not the select's: re-solved
        assert s.fallback_order(rest, req, after_select=True) == s.fallback_order(rest, again)
        assert len(s.fallback_order(rest, req, after_select=True)) == n - 1
