"""The RouteWise strategy with an injected clock: effective costs, the alpha sweep, the quota
shadow price, full concurrency pools, cold-start masking, the cold-burst fallback and the
request-log bootstrap."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import msgspec
import pytest

from actors.capacity_view import CapacityViews
from actors.strategies import RouteView, StrategyDeps, build_strategy
from actors.strategies.routewise import RouteWiseStrategy
from actors.strategies.routewise.candidates import Candidate, route_row, route_rows
from schemas import Observation, RouteRequest
from schemas.capacity import CapacityState
from schemas.config import ModelConfig
from tests.unit.actors import FakeClock

DRAWS = 400
CHEAP = {"prompt": 0.1, "completion": 0.2}
DEAR = {"prompt": 3.0, "completion": 15.0}


def route(port: int, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "openai_compat",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "provider_model_id": f"up-{port}",
        **extra,
    }


def quota_route(port: int, **extra: Any) -> dict[str, Any]:
    return route(
        port, provider_type="quota", quota={"limit": 100}, quota_source={"kind": "local"}, **extra
    )


_VIEWS: weakref.WeakKeyDictionary[RouteWiseStrategy, CapacityViews] = weakref.WeakKeyDictionary()


def pool_state(strategy: RouteWiseStrategy, state: CapacityState) -> None:
    """A pool's CapacityState event reaching the view ``strategy`` reads."""
    _VIEWS[strategy].update(state)


def make(
    clock: FakeClock, *routes: dict[str, Any], **params: Any
) -> tuple[RouteWiseStrategy, list[RouteView]]:
    model = ModelConfig.model_validate(
        {"id": "m", "router": "routewise", "router_params": params, "route": list(routes)}
    )
    # The strategy reads pool states from the ModelActor's capacity view, as in the actor.
    capacity = CapacityViews(model, "model:m")
    strategy = build_strategy(
        "routewise",
        model.router_params,
        StrategyDeps(model=model, clock=clock, capacity=capacity.state_of),
    )
    assert isinstance(strategy, RouteWiseStrategy)
    _VIEWS[strategy] = capacity
    views = [
        RouteView(index=i, endpoint=e, weight=r.weight, route=r)
        for i, (e, r) in enumerate(zip(model.endpoint_ids(), model.route, strict=True))
    ]
    return strategy, views


def ttft(
    strategy: RouteWiseStrategy,
    endpoint: str,
    ms: float,
    clock: FakeClock,
    n: int = 5,
    completion: int = 0,
) -> None:
    for _ in range(n):
        strategy.observe(
            Observation(
                endpoint=endpoint,
                model="m",
                outcome="success",
                ttft_ms=ms,
                prompt_tokens=1000,
                completion_tokens=completion,
                ts=clock.now,
            )
        )


def picks(
    strategy: RouteWiseStrategy, views: list[RouteView], n: int = DRAWS, prompt: int = 1000
) -> Counter[str]:
    req = RouteRequest(model="m", prompt_tokens=prompt)
    return Counter(strategy.select(views, req).endpoint for _ in range(n))


@pytest.fixture
def clock() -> FakeClock:
    c = FakeClock()
    c.now = 10_000.0
    return c


def test_on_demand_cost_prices_the_prompt_and_the_predicted_output(clock: FakeClock) -> None:
    s, views = make(
        clock, route(8001, pricing={"prompt": 2.0, "completion": 10.0}), route(8002, pricing=CHEAP)
    )
    req = RouteRequest(model="m", prompt_tokens=1000)
    cost = s.candidates(views, req, clock.now)[0].effective_cost
    assert cost == pytest.approx((1000 * 2.0 + 512 * 10.0) / 1e6)  # default 512 output
    ttft(s, views[1].endpoint, 100.0, clock, n=3, completion=100)  # the predictor learns
    cost = s.candidates(views, req, clock.now)[0].effective_cost
    assert cost == pytest.approx((1000 * 2.0 + 100 * 10.0) / 1e6)


@pytest.mark.parametrize(("alpha", "winner"), [(0.0, "cheap"), (1.0, "fast")])
def test_alpha_moves_traffic_from_the_cheapest_to_the_fastest(
    clock: FakeClock, alpha: float, winner: str
) -> None:
    s, views = make(
        clock,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        budget_alpha=alpha,
        random_seed=7,
    )
    cheap, fast = views[0].endpoint, views[1].endpoint
    ttft(s, cheap, 2000.0, clock)
    ttft(s, fast, 150.0, clock)
    counts = picks(s, views)
    assert counts[cheap if winner == "cheap" else fast] == DRAWS


def test_alpha_between_mixes_the_two_in_proportion(clock: FakeClock) -> None:
    s, views = make(
        clock,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        budget_alpha=0.5,
        random_seed=3,
    )
    ttft(s, views[0].endpoint, 2000.0, clock)
    ttft(s, views[1].endpoint, 150.0, clock)
    counts = picks(s, views)
    assert 0.35 * DRAWS < counts[views[1].endpoint] < 0.65 * DRAWS
    weights = [c.weight for c in s.last]
    assert weights == pytest.approx([0.5, 0.5])


def _lp_inputs(middle_cost: float, middle_ms: float = 200.0) -> list[Candidate]:
    return [
        Candidate("a", "on_demand", effective_cost=1.0, latency_ms=300.0, profiled=True),
        Candidate(
            "b", "on_demand", effective_cost=middle_cost, latency_ms=middle_ms, profiled=True
        ),
        Candidate("c", "on_demand", effective_cost=10.0, latency_ms=100.0, profiled=True),
    ]


def test_lp_solution_is_reused_until_an_input_moves_materially(clock: FakeClock) -> None:
    s, _ = make(clock, route(8001), route(8002), route(8003), budget_alpha=0.5)
    first = s.solve(_lp_inputs(2.0))  # budget 5.5 mixes b and c
    assert first == pytest.approx({1: 1 - 3.5 / 8, 2: 3.5 / 8})
    assert s.solve(_lp_inputs(2.001)) == first  # a 0.05 % move: the same solution
    assert s.solve(_lp_inputs(2.0, 200.3)) == first
    assert s.solve(_lp_inputs(3.0)) == pytest.approx({1: 1 - 2.5 / 7, 2: 2.5 / 7})


def _calibrate(s: RouteWiseStrategy, endpoint: str, clock: FakeClock) -> None:
    for completion in (50, 100, 200, 400, 800):
        s.observe(
            Observation(
                endpoint=endpoint,
                model="m",
                outcome="success",
                ttft_ms=500.0,
                prompt_tokens=1000,
                completion_tokens=completion,
                ts=clock.now,
            )
        )


def test_quota_shadow_price_rises_with_use(clock: FakeClock) -> None:
    s, views = make(clock, route(8001, pricing=DEAR), quota_route(8002))
    q = views[1].endpoint
    _calibrate(s, views[0].endpoint, clock)
    req = RouteRequest(model="m", prompt_tokens=1000)
    prices: list[float] = []
    for used in (0, 30, 60, 90):
        pool_state(s, CapacityState(pool=q, kind="quota", limit=100, used=used))
        price = s.candidates(views, req, clock.now)[1].effective_cost
        assert price is not None
        prices.append(price)
    assert prices == sorted(prices) and prices[0] < prices[-1]
    low, high = s.envelope.bounds(clock.now) or (0.0, 0.0)
    assert prices[0] == pytest.approx(low)  # nothing used: the envelope's floor
    assert prices[2] == pytest.approx(low * (high / low) ** 0.6)


def test_exhausted_quota_is_infeasible(clock: FakeClock) -> None:
    s, views = make(clock, route(8001, pricing=DEAR), quota_route(8002), random_seed=1)
    _calibrate(s, views[0].endpoint, clock)
    pool_state(s, CapacityState(pool=views[1].endpoint, kind="quota", limit=100, used=100))
    assert picks(s, views)[views[0].endpoint] == DRAWS
    assert s.last[1].excluded == "quota_exhausted"


def test_concurrency_route_is_free_while_a_slot_is_free_and_infeasible_when_full(
    clock: FakeClock,
) -> None:
    conc = route(8002, provider_type="concurrency", concurrency={"limit": 2})
    s, views = make(clock, route(8001, pricing=CHEAP), conc, budget_alpha=0.0, random_seed=1)
    c = views[1].endpoint
    ttft(s, views[0].endpoint, 300.0, clock)
    ttft(s, c, 300.0, clock)
    pool_state(s, CapacityState(pool=c, kind="concurrency", limit=2, used=1))
    assert picks(s, views)[c] == DRAWS  # free beats any price at equal latency
    assert s.last[1].effective_cost == 0.0 and s.last[1].free_slots == 1
    pool_state(s, CapacityState(pool=c, kind="concurrency", limit=2, used=2))
    assert picks(s, views)[c] == 0
    assert s.last[1].excluded == "concurrency_full"


def test_cold_start_masks_quota_routes_until_the_envelope_is_calibrated(
    clock: FakeClock,
) -> None:
    s, views = make(clock, route(8001, pricing=DEAR), quota_route(8002), random_seed=5)
    q = views[1].endpoint
    pool_state(s, CapacityState(pool=q, kind="quota", limit=100, used=0))
    assert picks(s, views)[q] == 0
    assert s.last[1].excluded == "envelope_uncalibrated"
    _calibrate(s, views[0].endpoint, clock)
    ttft(s, q, 500.0, clock)  # same latency: the cheaper quota floor wins
    assert picks(s, views)[q] == DRAWS


def test_unresolved_quota_source_is_masked(clock: FakeClock) -> None:
    s, views = make(clock, route(8001, pricing=DEAR), quota_route(8002))
    _calibrate(s, views[0].endpoint, clock)
    pool_state(
        s,
        CapacityState(
            pool=views[1].endpoint,
            kind="quota",
            limit=100,
            used=0,
            resolved=False,
            reason="no reading yet",
        ),
    )
    picks(s, views, n=1)
    assert s.last[1].excluded == "quota_unresolved"


def test_cold_burst_with_nothing_feasible_falls_back_to_the_weighted_draw(
    clock: FakeClock,
) -> None:
    s, views = make(
        clock,
        quota_route(8001, weight=3.0),
        quota_route(8002),
        envelope_bootstrap_donor_models=["donor"],
        random_seed=2,
    )
    counts = picks(s, views)
    assert sum(counts.values()) == DRAWS and s.fallback_draws == DRAWS
    assert counts[views[0].endpoint] > counts[views[1].endpoint] > 0  # by weight 3:1


def test_fallback_order_is_the_lp_resolved_without_the_routes_before(clock: FakeClock) -> None:
    s, views = make(
        clock,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        route(8003, pricing={"prompt": 1.0, "completion": 5.0}),
        budget_alpha=1.0,
    )
    ttft(s, views[0].endpoint, 3000.0, clock)
    ttft(s, views[1].endpoint, 100.0, clock)
    ttft(s, views[2].endpoint, 800.0, clock)
    req = RouteRequest(model="m", prompt_tokens=1000)
    order = s.fallback_order(views, req)
    assert [v.endpoint for v in order] == [views[1].endpoint, views[2].endpoint, views[0].endpoint]


def test_bootstrap_replays_log_rows_with_their_own_timestamps(clock: FakeClock) -> None:
    s, views = make(
        clock, route(8001, pricing=CHEAP), route(8002, pricing=DEAR), latency_window_sec=600.0
    )
    a, b = views[0].endpoint, views[1].endpoint
    rows = [
        {
            "kind": "attempt",
            "endpoint": a,
            "outcome": "success",
            "ttft_ms": 900.0,
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "ts": clock.now - 60,
        },
        {
            "kind": "attempt",
            "endpoint": a,
            "outcome": "success",
            "ttft_ms": 9000.0,
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "ts": clock.now - 3600,
        },
        {
            "kind": "attempt",
            "endpoint": b,
            "outcome": "success",
            "ttft_ms": 4000.0,
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "ts": clock.now - 3600,
        },
        {
            "kind": "request",
            "endpoint": b,
            "outcome": "success",
            "ttft_ms": 1.0,
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "ts": clock.now,
        },
    ]
    assert s.bootstrap(rows) == 3
    assert s.latency.estimate(a, clock.now) == pytest.approx(900.0)  # the old one aged out
    assert s.latency.estimate(b, clock.now) == pytest.approx(4000.0)  # history as a prior
    assert s.latency.samples(b, clock.now) == 0
    assert len(s.envelope) == 3


def test_failures_weigh_in_the_latency_estimate(clock: FakeClock) -> None:
    s, views = make(clock, route(8001, pricing=CHEAP), route(8002, pricing=DEAR))
    a = views[0].endpoint
    ttft(s, a, 100.0, clock, n=1)
    s.observe(Observation(endpoint=a, model="m", outcome="failure", ts=clock.now))
    assert s.latency.estimate(a, clock.now) == pytest.approx((100.0 + 60_000.0) / 2)


def test_a_rate_limit_is_back_pressure_never_a_failures_latency(clock: FakeClock) -> None:
    # A 429 was charged the 60 s failure penalty, so a burst a provider pushed back on drove
    # the LP off the route (the key cools and the capacity view prices the wait instead).
    s, views = make(clock, route(8001, pricing=CHEAP), route(8002, pricing=DEAR))
    a = views[0].endpoint
    ttft(s, a, 100.0, clock, n=1)
    limited = Observation(endpoint=a, model="m", outcome="failure", status=429, ts=clock.now)
    s.observe(limited)
    assert s.latency.estimate(a, clock.now) == pytest.approx(100.0)
    quota = msgspec.structs.replace(limited, error_kind="quota_exhausted")
    s.observe(quota)  # a spent quota is no pace to slow down to: the route's failure
    assert s.latency.estimate(a, clock.now) == pytest.approx((100.0 + 60_000.0) / 2)


def test_a_logged_rate_limit_is_not_replayed_as_a_failure(clock: FakeClock) -> None:
    s, views = make(clock, route(8001, pricing=CHEAP), route(8002, pricing=DEAR))
    a = views[0].endpoint
    answered = {"kind": "attempt", "endpoint": a, "outcome": "success", "ttft_ms": 100.0}
    limited = {"kind": "attempt", "endpoint": a, "outcome": "failure", "status": 429}
    rows = [{**answered, "ts": clock.now - 2}, {**limited, "ts": clock.now - 1}]

    assert s.bootstrap(rows) == 1
    assert s.latency.estimate(a, clock.now) == pytest.approx(100.0)


def test_strict_fallback_mode_sends_one_route(clock: FakeClock) -> None:
    s, _ = make(clock, route(8001), route(8002), fallback_mode="strict")
    assert s.single_route


def test_probe_due_picks_cold_then_idle_routes_within_the_concurrency(clock: FakeClock) -> None:
    s, views = make(
        clock,
        route(8001),
        route(8002),
        route(8003),
        routewise_probe_enabled=True,
        routewise_probe_idle_threshold_sec=60.0,
        routewise_probe_max_concurrency=2,
        routewise_probe_timeout_sec=10.0,
    )
    a, b, c = (v.endpoint for v in views)
    ttft(s, a, 100.0, clock, n=1)
    assert s.probe_due([a, b, c], clock.now) == [b, c]  # a was just measured
    assert s.probe_due([a, b, c], clock.now) == []  # both still in flight
    s.sample(b, True, 250.0, clock.now)
    assert s.latency.estimate(b, clock.now) == pytest.approx(250.0)
    clock.now += 61  # a is idle now; c's probe is lost after its timeout
    assert s.probe_due([a, b, c], clock.now) == [c, a]


def test_probe_due_is_empty_while_the_prober_is_off(clock: FakeClock) -> None:
    s, views = make(clock, route(8001), route(8002))
    assert s.probe_due([v.endpoint for v in views], clock.now) == []


def test_hedge_checkpoint_when_the_primary_misses_its_slo_and_the_backup_meets_it(
    clock: FakeClock,
) -> None:
    s, views = make(
        clock,
        route(8001),
        route(8002),
        latency_slo_sec=1.0,
        latency_hedge_mode="probability_target",
    )
    slow, fast = views[0].endpoint, views[1].endpoint
    assert s.hedge_after_ms(slow, fast) is None  # no evidence yet
    ttft(s, slow, 1500.0, clock)
    ttft(s, fast, 100.0, clock)
    at = s.hedge_after_ms(slow, fast)
    assert at == pytest.approx(250.0)  # the first checkpoint: a quarter of the SLO
    assert s.hedge_after_ms(fast, slow) is None  # a primary that meets its SLO: no hedge


def test_a_primary_stalled_past_its_whole_history_is_hedged_when_the_backup_can_make_it(
    clock: FakeClock,
) -> None:
    """A primary still waiting at a checkpoint its whole history beat is a stall, not a
    certain success: the backup is raced there if it can still meet the SLO."""
    s, views = make(
        clock,
        route(8001),
        route(8002),
        route(8003),
        latency_slo_sec=1.0,
        latency_hedge_mode="probability_target",
    )
    primary, backup, slow = (v.endpoint for v in views)
    ttft(s, primary, 50.0, clock, n=8)
    ttft(s, backup, 100.0, clock)
    ttft(s, slow, 1500.0, clock)
    assert s.hedge_after_ms(primary, backup) == pytest.approx(250.0)  # the first checkpoint
    assert s.hedge_after_ms(primary, slow) is None  # a backup that cannot meet the SLO


def test_hedging_is_off_by_default(clock: FakeClock) -> None:
    s, views = make(clock, route(8001), route(8002), latency_slo_sec=1.0)
    ttft(s, views[0].endpoint, 1500.0, clock)
    ttft(s, views[1].endpoint, 100.0, clock)
    assert s.hedge_after_ms(views[0].endpoint, views[1].endpoint) is None


# -- under load: queueing, capacity, in-band exploration ------------------------------------


def make_loaded(
    clock: FakeClock,
    load: dict[str, tuple[int, float | None]],
    *routes: dict[str, Any],
    **params: Any,
) -> tuple[RouteWiseStrategy, list[RouteView]]:
    """``make`` with each route's (in flight, learned limit) as the ModelActor counts them."""
    model = ModelConfig.model_validate(
        {"id": "m", "router": "routewise", "router_params": params, "route": list(routes)}
    )
    strategy = build_strategy(
        "routewise",
        model.router_params,
        StrategyDeps(model=model, clock=clock, load=lambda e: load.get(e, (0, None))),
    )
    assert isinstance(strategy, RouteWiseStrategy)
    views = [
        RouteView(index=i, endpoint=e, weight=r.weight, route=r)
        for i, (e, r) in enumerate(zip(model.endpoint_ids(), model.route, strict=True))
    ]
    return strategy, views


def held(s: RouteWiseStrategy, endpoint: str, ttft_ms: float, latency_ms: float) -> None:
    """One success on ``endpoint``: first token after ``ttft_ms``, slot held ``latency_ms``."""
    s.observe(
        Observation(
            endpoint=endpoint,
            model="m",
            outcome="success",
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
            prompt_tokens=1000,
        )
    )


def test_the_lp_latency_includes_the_wait_for_a_slot_of_a_filling_route(clock: FakeClock) -> None:
    load: dict[str, tuple[int, float | None]] = {}
    s, views = make_loaded(
        clock, load, route(8001, pricing=CHEAP), route(8002, pricing=CHEAP), route(8003)
    )
    a, b, c = (v.endpoint for v in views)
    for e in (a, b, c):
        held(s, e, 100.0, 2000.0)  # each answer holds its slot two seconds
    req = RouteRequest(model="m", prompt_tokens=1000)
    load[a] = (12, 16.0)  # three quarters of sixteen learned slots taken
    load[b] = (4, 4.0)  # at its limit: out of the LP
    load[c] = (4, 16.0)  # a quarter
    busy = {x.endpoint: x for x in s.candidates(views, req, clock.now)}

    # An M/M/c queue at three quarters of 16 slots: 2000 * 0.75^(sqrt(34) - 1) / (16 / 4).
    assert busy[a].latency_ms == pytest.approx(100.0 + 2000.0 * 0.75 ** (34**0.5 - 1) / 4.0)
    assert busy[b].effective_cost is None and busy[b].excluded == "capacity_full"
    # Before: a quarter full already cost a route three quarters more (the headroom,
    # squared); a route with most slots free makes nobody wait.
    assert busy[c].latency_ms == pytest.approx(100.0, abs=0.5)


def test_unprofiled_routes_are_explored_in_band_with_a_bounded_share(clock: FakeClock) -> None:
    s, views = make_loaded(
        clock,
        {},
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        budget_alpha=0.0,
        random_seed=3,
        explore_unprofiled_share=0.1,
    )
    cheap, never = views[0].endpoint, views[1].endpoint
    ttft(s, cheap, 100.0, clock)  # only the cheap route is measured
    counts = picks(s, views, n=2000)

    # About a tenth goes to the route the LP would never try; 5 sigma either way.
    assert 200 - 5 * 13.4 <= counts[never] <= 200 + 5 * 13.4
    assert s.explored == counts[never]
    ttft(s, never, 100.0, clock)  # now profiled: no more exploration, the LP decides alone
    assert picks(s, views, n=200)[never] == 0


def test_exploration_off_never_sends_to_an_unprofiled_route(clock: FakeClock) -> None:
    s, views = make_loaded(
        clock,
        {},
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        budget_alpha=0.0,
        explore_unprofiled_share=0.0,
    )
    ttft(s, views[0].endpoint, 100.0, clock)

    assert picks(s, views)[views[1].endpoint] == 0


def test_the_rows_of_one_pass_are_route_rows_own(clock: FakeClock) -> None:
    """``route_rows`` (the decision's one pass) gives each route the row ``route_row`` does:
    on demand idle, queueing, full and unpriced, a concurrency route, a quota route."""
    load: dict[str, tuple[int, float | None]] = {}
    conc = route(8005, provider_type="concurrency", concurrency={"limit": 2})
    s, views = make_loaded(
        clock,
        load,
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        route(8003, pricing=CHEAP),
        route(8004),
        conc,
    )
    a, b, c, d, e = (v.endpoint for v in views)
    for endpoint, ms in ((a, 900.0), (b, 300.0), (d, 500.0)):
        held(s, endpoint, ms, ms * 2)
    for state in ((0, None), (0, 4.0), (3, 4.0), (4, 4.0), (7, 12.0)):
        load.update({a: state, b: state, c: (1, 8.0), d: state, e: state})
        bounds = s.envelope.bounds(clock.now)
        for prompt, completion in ((1000, 0), (0, 40), (-3, 12)):
            rows = route_rows(views, prompt, completion, bounds, clock.now, s.latency, s._deps)
            assert rows == [
                route_row(
                    v.endpoint, v.route, prompt, completion, bounds, clock.now, s.latency, s._deps
                )
                for v in views
            ]
