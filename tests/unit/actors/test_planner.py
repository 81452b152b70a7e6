"""The ModelActor's decision as a function (actors/state/planner.py), no bus: the plan from
the views, the request and the clock; the half-open probe it must lease, as data, and what it
does with the answer; the pin and prefill share it hands the actor to record; the strategy's
optional hooks (strict, fallback order, hedge) read without asking which strategy it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors.keypool_view import KeyViews
from actors.model_load import ModelLoad
from actors.state.affinity import AffinityTable
from actors.state.cooling import CooledRoutes
from actors.state.planner import Decision, ProbeLease, RoutePlanner
from actors.state.prefill import PrefillLoad
from actors.state.route_table import RouteTable
from actors.strategies import RouteView, RoutingStrategy, StrategyDeps, build_strategy
from schemas import (
    AllCircuitsOpenError,
    EndpointState,
    NoRouteForModalityError,
    Observation,
    RouteRequest,
)
from schemas.config import ModelConfig, RoutingConfig

if TYPE_CHECKING:
    from collections.abc import Generator, Sequence

NOW = 1_000.0
A, B, C = "m:local-8001", "m:local-8002", "m:local-8003"


def _model(*weights: float) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": f"http://127.0.0.1:{8001 + i}/v1",
                    "weight": w,
                    "provider_model_id": f"up-{i}",
                }
                for i, w in enumerate(weights)
            ],
        }
    )


class _Planned:
    """A planner over fresh views of model ``m`` (the tables a ModelActor would own)."""

    def __init__(
        self,
        *weights: float,
        affinity: bool = False,
        strategy: RoutingStrategy | None = None,
    ) -> None:
        self.model = _model(*weights)
        self.routing = RoutingConfig.model_validate({"affinity": {"enabled": affinity}})
        self.table = RouteTable(self.model, self.routing, fixed=True)
        self.affinity = AffinityTable(60.0, 1000)
        self.pins_changed = 0
        self.planner = RoutePlanner(
            self.model,
            self.routing,
            table=self.table,
            keys=KeyViews(self.model, self.routing.key_pool),
            cooled=CooledRoutes(),
            affinity=self.affinity,
            prefill=PrefillLoad(elephant_tokens=10_000, hint_ttl=60.0),
            load=ModelLoad(self.model, self.routing, lambda: NOW),
            strategy=strategy or build_strategy("fixed", {}, StrategyDeps(model=self.model)),
            host=None,
            router="fixed",
            spills=False,
            pins_changed=self._pins_changed,
        )

    def _pins_changed(self) -> None:
        self.pins_changed += 1

    def circuit(self, endpoint: str, state: str, *, open_until: float | None = None) -> None:
        self.table.update_state(
            EndpointState(
                endpoint=endpoint,
                model="m",
                circuit_state=state,
                availability=1.0,
                open_until=open_until,
                seq=1,
            )
        )


def _run(
    planning: Generator[ProbeLease, bool, Decision], grants: Sequence[bool] = ()
) -> tuple[Decision, list[str]]:
    """Drive a decision to its end, answering its probe leases with ``grants`` in turn;
    returns the decision and the routes whose probe it asked for."""
    asked: list[str] = []
    answers = iter(grants)
    try:
        lease = next(planning)
        while True:
            asked.append(lease.entry.endpoint)
            lease = planning.send(next(answers))
    except StopIteration as done:
        return done.value, asked


def _endpoints(decision: Decision) -> list[str]:
    return [c.endpoint for c in decision.plan.candidates]


def test_the_only_drawn_route_leads_and_weight_zero_routes_stay_out() -> None:
    p = _Planned(1.0, 0.0, 0.0)
    decision, asked = _run(
        p.planner.decide(RouteRequest(model="m", request_id="r1"), frozenset(), NOW)
    )
    assert asked == []
    assert _endpoints(decision) == [A]
    assert decision.plan.reason == "fixed"
    assert decision.primary == A


def test_the_primary_is_first_and_closed_routes_follow_in_declared_order() -> None:
    p = _Planned(1.0, 1.0, 1.0)
    for _ in range(20):
        decision, _ = _run(p.planner.decide(RouteRequest(model="m"), frozenset(), NOW))
        primary, *rest = _endpoints(decision)
        assert rest == [e for e in (A, B, C) if e != primary]


def test_routes_full_of_capacity_are_left_out_of_the_draw() -> None:
    p = _Planned(1.0, 1.0, 1.0)
    decision, _ = _run(p.planner.decide(RouteRequest(model="m"), frozenset({A, B}), NOW))
    assert _endpoints(decision) == [C]


def test_an_open_circuit_past_its_cooldown_is_asked_for_as_a_probe_lease() -> None:
    p = _Planned(1.0)
    p.circuit(A, "open", open_until=NOW - 1)
    decision, asked = _run(
        p.planner.decide(RouteRequest(model="m", request_id="r1"), frozenset(), NOW), [True]
    )
    assert asked == [A]
    assert decision.plan.reason == "probe"
    assert decision.plan.candidates[0].probe


def test_a_refused_probe_lease_leaves_nothing_to_serve_with_retry_after() -> None:
    p = _Planned(1.0)
    p.circuit(A, "open", open_until=NOW - 1)
    with pytest.raises(AllCircuitsOpenError):
        _run(p.planner.decide(RouteRequest(model="m", request_id="r1"), frozenset(), NOW), [False])


def test_a_refused_probe_falls_back_to_the_closed_route() -> None:
    p = _Planned(1.0, 1.0)
    p.circuit(A, "half_open")
    for _ in range(20):
        decision, asked = _run(
            p.planner.decide(RouteRequest(model="m", request_id="r"), frozenset(), NOW), [False]
        )
        assert asked in ([], [A])
        assert _endpoints(decision) == [B]


def test_a_dry_request_asks_for_no_lease_and_records_nothing() -> None:
    p = _Planned(1.0)
    p.circuit(A, "open", open_until=NOW - 1)
    decision, asked = _run(p.planner.decide(RouteRequest(model="m", dry=True), frozenset(), NOW))
    assert asked == []
    assert decision.plan.candidates[0].probe
    assert (decision.pin, decision.prefill) == (None, None)


def test_the_tripped_breaker_refuses_until_it_ends() -> None:
    p = _Planned(1.0)
    p.planner.tripped_until = NOW + 30
    with pytest.raises(AllCircuitsOpenError) as exc:
        _run(p.planner.decide(RouteRequest(model="m"), frozenset(), NOW))
    assert exc.value.retry_after == 30


def test_a_modality_no_route_accepts_is_refused() -> None:
    p = _Planned(1.0)
    with pytest.raises(NoRouteForModalityError):
        _run(p.planner.decide(RouteRequest(model="m", modalities=("audio",)), frozenset(), NOW))


def test_the_caller_is_pinned_to_its_primary_and_the_pin_then_chooses() -> None:
    p = _Planned(1.0, 1.0, 1.0, affinity=True)
    req = RouteRequest(model="m", caller="alice", request_id="r1")
    first, _ = _run(p.planner.decide(req, frozenset(), NOW))
    assert first.pin == "alice"
    p.affinity.pin("alice", first.primary, NOW)  # what the actor records
    for _ in range(10):
        again, _ = _run(p.planner.decide(req, frozenset(), NOW))
        assert (again.primary, again.plan.reason) == (first.primary, "affinity")


def test_a_pin_to_a_route_no_longer_admitted_is_dropped_and_reported() -> None:
    p = _Planned(1.0, 1.0, affinity=True)
    p.affinity.pin("alice", A, NOW)
    p.circuit(A, "open", open_until=NOW + 60)
    decision, _ = _run(p.planner.decide(RouteRequest(model="m", caller="alice"), frozenset(), NOW))
    assert decision.primary == B
    assert p.affinity.get("alice", NOW) is None
    assert p.pins_changed == 1


class _LastFirst(RoutingStrategy):
    """Picks the last route, orders the fallbacks last first, hedges after 250 ms."""

    orders_fallbacks = True

    def __init__(self, *, strict: bool = False) -> None:
        self._strict = strict

    @property
    def single_route(self) -> bool:
        return self._strict

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        return routes[-1]

    def observe(self, observation: Observation) -> None:
        """Learns nothing."""

    def fallback_order(
        self, routes: Sequence[RouteView], request: RouteRequest, *, after_select: bool = False
    ) -> list[RouteView]:
        return list(reversed(routes))

    def hedge_after_ms(self, primary: str, backup: str) -> float | None:
        return 250.0


def test_the_strategy_hooks_order_the_fallbacks_and_set_the_hedge() -> None:
    p = _Planned(1.0, 1.0, 1.0, strategy=_LastFirst())
    decision, _ = _run(p.planner.decide(RouteRequest(model="m"), frozenset(), NOW))
    assert _endpoints(decision) == [C, B, A]
    assert decision.plan.hedge_after_ms == 250.0


class _Seen(_LastFirst):
    """Records the views it is shown: what it was asked to choose from, and to order."""

    def __init__(self, *, reads_backlog: bool) -> None:
        super().__init__()
        self.reads_backlog = reads_backlog
        self.shown: list[list[RouteView]] = []

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        self.shown.append(list(routes))
        return super().select(routes, request)

    def fallback_order(
        self, routes: Sequence[RouteView], request: RouteRequest, *, after_select: bool = False
    ) -> list[RouteView]:
        self.shown.append(list(routes))
        assert after_select  # the rest of the select's own views
        return super().fallback_order(routes, request, after_select=after_select)


@pytest.mark.parametrize("reads_backlog", [True, False])
def test_a_strategy_that_reads_no_backlog_is_shown_none(reads_backlog: bool) -> None:
    """A route's prefill backlog reaches a strategy that reads it; one that does not
    (RouteWise) is shown 0, and its fallbacks are asked after its select."""
    strategy = _Seen(reads_backlog=reads_backlog)
    p = _Planned(1.0, 1.0, 1.0, strategy=strategy)
    p.planner._prefill.acquire("earlier", B, 5_000, NOW)
    decision, _ = _run(p.planner.decide(RouteRequest(model="m"), frozenset(), NOW))
    assert _endpoints(decision) == [C, B, A]
    backlogs = [{v.endpoint: v.backlog for v in views} for views in strategy.shown]
    expected = 5_000 if reads_backlog else 0
    assert backlogs == [{A: 0, B: expected, C: 0}, {A: 0, B: expected}]


def test_a_strict_strategy_plans_its_primary_alone_and_the_default_hooks_do_nothing() -> None:
    strict = _Planned(1.0, 1.0, 1.0, strategy=_LastFirst(strict=True))
    decision, _ = _run(strict.planner.decide(RouteRequest(model="m"), frozenset(), NOW))
    assert (_endpoints(decision), decision.plan.hedge_after_ms) == ([C], None)
    fixed = build_strategy("fixed", {})
    assert (fixed.single_route, fixed.orders_fallbacks, fixed.session_affinity) == (
        False,
        False,
        True,
    )
    assert fixed.hedge_after_ms(A, B) is None
    assert fixed.host(strict.model, lambda: NOW) is None
