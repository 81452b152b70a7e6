"""ModelLoad (actors/model_load.py): which provider refusals cut a route's learned
concurrency limit. A 429 that reports a rate limit's state refused a pace, which cooling
keeps; one that says nothing of a rate may be a concurrency plan's, and halves the limit."""

from __future__ import annotations

import msgspec
import pytest

from actors.model_load import ModelLoad
from schemas import (
    HEDGE_DECLINED,
    RATE_LIMIT_EXCEEDED,
    Observation,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
)
from schemas.config import ModelConfig, RoutingConfig

NOW = 1_000.0
A, B = "m:local-8001", "m:local-8002"


def _load() -> ModelLoad:
    model = ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": f"http://127.0.0.1:{8001 + i}/v1",
                    "provider_model_id": f"up-{i}",
                }
                for i in range(2)
            ],
        }
    )
    return ModelLoad(model, RoutingConfig(), lambda: NOW)


def _refused(load: ModelLoad, in_flight: int, kind: str) -> Observation:
    """``in_flight`` requests sent to A, the last of them refused with a 429 of ``kind``."""
    for i in range(in_flight):
        load.load.issued(f"r{i}", (A, B), NOW)
    return Observation(
        endpoint=A,
        model="m",
        outcome="failure",
        status=429,
        error_kind=kind,
        retry_after=1.0,
        request_id=f"r{in_flight - 1}",
    )


def test_a_429_that_says_nothing_of_a_rate_halves_the_concurrency_it_refused_at() -> None:
    load = _load()

    event = load.observed(_refused(load, 10, "http_429"), NOW)

    assert event is not None and event.reason == "rate_limited"
    assert load.load.limits[A].limit == pytest.approx(5.0)


def test_a_refused_rate_leaves_the_learned_concurrency_as_it_was() -> None:
    # Before: halved like a concurrency plan's refusal. A route whose answers stream for
    # seconds holds many requests at once under a few a second; each halving left it at half
    # its rate (replay `ratelimited`: alpha 0 cost 2.59 $ for the cheapest fill's 1.21).
    load = _load()

    event = load.observed(_refused(load, 10, RATE_LIMIT_EXCEEDED), NOW)

    assert event is None
    assert load.load.limits[A].limit is None
    assert load.of(A) == (9, 16.0)  # the refused one moved on to B; slow start as before


def _plan(hedge_after_ms: float | None) -> tuple[RoutePlan, RouteRequest]:
    candidates = tuple(RouteCandidate(endpoint=e, kind="openai_compat") for e in (A, B))
    plan = RoutePlan(model="m", candidates=candidates, hedge_after_ms=hedge_after_ms)
    return plan, RouteRequest(model="m", request_id="r", prompt_tokens=100)


def test_a_hedged_plans_backup_failing_beside_its_primary_leaves_the_primary_counted() -> None:
    load = _load()
    plan, req = _plan(hedge_after_ms=500.0)
    load.issued("r", plan, NOW, req)

    load.observed(Observation(endpoint=B, model="m", outcome="failure", request_id="r"), NOW)

    assert (load.load.in_flight(A), load.load.in_flight(B)) == (1, 0)


def test_an_unhedged_plans_later_candidate_answering_moves_the_count_there() -> None:
    # An observation naming a later candidate: the ingress skipped those between.
    load = _load()
    plan, req = _plan(hedge_after_ms=None)
    load.issued("r", plan, NOW, req)

    load.observed(Observation(endpoint=B, model="m", outcome="failure", request_id="r"), NOW)

    assert (load.load.in_flight(A), load.load.in_flight(B)) == (0, 0)


def test_a_probe_candidate_given_back_unattempted_moves_the_count_on_as_never_sent() -> None:
    # The ingress gives back a half-open probe it never sends with a cancelled observation of
    # attempt 0; it goes on to the next candidate (before: the count ended at the probe).
    load = _load()
    plan, req = _plan(hedge_after_ms=None)
    load.issued("r", plan, NOW, req)

    given_back = Observation(endpoint=A, model="m", outcome="cancelled", attempt=0, probe=True)
    load.observed(msgspec.structs.replace(given_back, request_id="r"), NOW)

    assert (load.load.in_flight(A), load.load.in_flight(B)) == (0, 1)


def test_a_hedge_lost_by_the_primary_moves_the_count_to_the_backup() -> None:
    load = _load()
    plan, req = _plan(hedge_after_ms=500.0)
    load.issued("r", plan, NOW, req)

    declined = Observation(
        endpoint=A, model="m", outcome="cancelled", error_kind=HEDGE_DECLINED, request_id="r"
    )
    load.observed(declined, NOW)

    assert (load.load.in_flight(A), load.load.in_flight(B)) == (0, 1)
