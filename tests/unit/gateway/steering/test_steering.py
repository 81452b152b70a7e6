"""The ingress's SteeringBook and Steerer: orderings from views, without a bus."""

from __future__ import annotations

import random

import pytest

from gateway.steering.resolver import Steerer, book_from, is_steering
from schemas import (
    ChainEntry,
    ChainState,
    Evidence,
    InvalidRequestError,
    ModelEvidence,
    SteeringState,
)
from schemas.config import ModelConfig


def _models() -> list[ModelConfig]:
    return [
        ModelConfig.model_validate(m)
        for m in (
            {"id": "a", "catalog": {"tier": 3}},
            {
                "id": "b",
                "catalog": {
                    "tier": 2,
                    "free_allowance": {"monthly_tokens": 10},
                    "price": {"input_per_mtok": 1},
                },
            },
            {"id": "c", "catalog": {"price": {"input_per_mtok": 0.5}}},
            {"id": "d", "catalog": {"enabled": False}},
        )
    ]


def test_is_steering_reads_only_auto_and_auto_colon() -> None:
    assert [is_steering(n) for n in ("auto", "AUTO:x", "auto:", "automatic", "gpt")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_models_that_cannot_serve_go_last_and_cheapest_ranks_by_allowance_then_price() -> None:
    evidence = Evidence(models=(ModelEvidence(model="a", healthy=False),))
    book = book_from(_models(), SteeringState(), {}, evidence)

    assert [c.model for c in book.axes["smartest"].candidates] == ["b", "c", "a"]
    assert [c.model for c in book.axes["cheapest"].candidates] == ["b", "c", "a"]
    assert book.axes["smartest"].excluded == (("d", "disabled"),)


def test_an_org_chain_reads_as_unknown_to_other_orgs() -> None:
    chains = {"team": ChainState(name="team", org="acme", models=(ChainEntry(model="c"),))}
    book = book_from(_models(), SteeringState(chains=("team",)), chains, None)

    assert book.ordering("auto:TEAM", "acme")[4].candidates[0].model == "c"
    with pytest.raises(InvalidRequestError) as exc:
        book.ordering("auto:team", "other")
    assert "'team'" in exc.value.message and exc.value.param == "model"
    assert book.advertised("other") == [
        "auto",
        "auto:smartest",
        "auto:fastest",
        "auto:cheapest",
        "auto:reliable",
    ]


def test_exploration_picks_another_model_only_in_scored_orderings_and_not_while_degraded() -> None:
    state = SteeringState(exploration=1.0)
    chains = {"p": ChainState(name="p", models=(ChainEntry(model="a"), ChainEntry(model="b")))}
    steer = Steerer(affinity=False, ttl=60, clock=lambda: 0.0, rng=random.Random(1))
    normal = book_from(_models(), state, chains, None)
    degraded = book_from(_models(), state, chains, Evidence(degraded=True))

    def first(book: object, name: str) -> str:
        return steer.resolve(book, name, org="", role="free", caller="x").models[0]  # type: ignore[arg-type]

    assert first(normal, "auto") != "a"
    assert first(normal, "auto:p") == "a"  # a chain's written order is never explored
    assert first(degraded, "auto") == "a"
