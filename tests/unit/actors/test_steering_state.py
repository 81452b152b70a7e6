"""The steering owners' pure state: chain edits and presets, the evidence book's counting and
its guardrail multipliers; the gate timing evidence publishes."""

from __future__ import annotations

import calendar

import msgspec
import pytest

from actors.chain import _backfill, apply_edit
from actors.state.evidence_gate import EvidenceGate
from actors.state.scoring import (
    EvidenceBook,
    allowance_multiplier,
    month_of,
    rate_limit_multiplier,
)
from actors.state.steering_settings import initial_chains, starting_state
from schemas import (
    ChainEdit,
    ChainEntry,
    ChainState,
    Guardrails,
    InvalidRequestError,
    Observation,
    SteeringState,
)
from schemas.catalog import ChainConfig
from schemas.config import ModelConfig

CATALOGUE = (("a", True), ("b", True), ("c", False))
G = Guardrails()


def _chain(*models: tuple[str, bool]) -> tuple[ChainEntry, ...]:
    return tuple(ChainEntry(model=m, enabled=on) for m, on in models)


def test_a_preset_writes_priority_only_and_names_the_rest_switched_off() -> None:
    chain = _chain(("c", True), ("a", False))

    out = apply_edit(chain, ChainEdit(verb="preset", order=("a", "b", "c")), CATALOGUE)

    assert out == _chain(("a", False), ("b", False), ("c", True))


def test_move_counts_positions_from_one_and_refuses_outside_the_chain() -> None:
    chain = _chain(("a", True), ("b", True), ("c", True))

    assert apply_edit(chain, ChainEdit(verb="move", model="c", position=1), CATALOGUE) == _chain(
        ("c", True), ("a", True), ("b", True)
    )
    for position in (0, 4):
        with pytest.raises(InvalidRequestError) as exc:
            apply_edit(chain, ChainEdit(verb="move", model="c", position=position), CATALOGUE)
        assert exc.value.param == "position"


def test_backfill_appends_unseen_models_with_their_own_enabled_state() -> None:
    state = ChainState(name="x", backfill=True, models=_chain(("a", True)))

    grown = _backfill(state, CATALOGUE, seen={"a"})

    assert grown.models == _chain(("a", True), ("b", True), ("c", False))
    assert _backfill(state, CATALOGUE, seen={"a", "b", "c"}) is state


def _obs(
    model: str, outcome: str = "success", status: int | None = None, error_kind: str = ""
) -> Observation:
    return Observation(
        endpoint=f"{model}:echo",
        model=model,
        outcome=outcome,
        prompt_tokens=10,
        completion_tokens=5,
        latency_ms=10.0,
        status=status,
        error_kind=error_kind,
    )


def test_usage_counts_each_attempt_once_per_utc_month_but_not_refusals_or_cancels() -> None:
    model = ModelConfig.model_validate(
        {"id": "m", "catalog": {"free_allowance": {"monthly_tokens": 100}}}
    )
    book = EvidenceBook([model])
    december = calendar.timegm((2026, 12, 31, 23, 0, 0))
    january = calendar.timegm((2027, 1, 1, 0, 30, 0))

    for obs in (
        _obs("m"),
        _obs("m", "failure", status=500),
        _obs("m", "failure", error_kind="key_pool_exhausted"),
        _obs("m", "cancelled"),
    ):
        book.learn(obs, december)
    dec = book.evidence(G, december, degraded=False, seq=1).models[0]
    book.learn(_obs("m"), january)
    jan = book.evidence(G, january, degraded=False, seq=2).models[0]

    assert (dec.requests_used, dec.tokens_used, dec.remaining) == (2, 30, 70.0)
    assert dec.allowance_used == pytest.approx(0.3)
    assert (jan.requests_used, jan.tokens_used) == (1, 15)


def test_only_back_pressure_sets_the_rate_limit_penalty_not_a_spent_quota() -> None:
    book = EvidenceBook([ModelConfig.model_validate({"id": "m"}), ModelConfig(id="q")])
    book.learn(_obs("m", "failure", status=429), 100.0)
    book.learn(_obs("q", "failure", status=429, error_kind="quota_exhausted"), 100.0)
    by_id = {e.model: e for e in book.evidence(G, 100.0, degraded=False, seq=1).models}

    assert by_id["m"].rate_limit_multiplier == 0.5
    assert by_id["q"].rate_limit_multiplier == 1.0  # its key is muted, not slowed


def test_guardrail_multipliers_scale_between_their_thresholds() -> None:
    assert allowance_multiplier(None, G) == allowance_multiplier(0.79, G) == 1.0
    assert allowance_multiplier(0.9, G) == pytest.approx(0.6)
    assert allowance_multiplier(1.0, G) == allowance_multiplier(3.0, G) == pytest.approx(0.2)
    assert rate_limit_multiplier(None, 0.0, G) == 1.0
    assert rate_limit_multiplier(100.0, 100.0, G) == 0.5
    assert rate_limit_multiplier(100.0, 250.0, G) == pytest.approx(0.75)
    assert rate_limit_multiplier(100.0, 400.0, G) == 1.0


def test_the_evidence_gate_publishes_flips_at_once_but_at_most_four_an_interval() -> None:
    gate = EvidenceGate(0.2, 4)
    assert gate.changed(0.0, lambda: "a")  # nothing published yet: at once
    gate.published("a", 0.0)

    at_once = []
    for i, signature in enumerate("bcdefg", start=1):
        now = 0.01 * i
        at_once.append(gate.changed(now, lambda s=signature: s))  # type: ignore[misc]
        if at_once[-1]:
            gate.published(signature, now)

    assert at_once == [True] * 4 + [False] * 2  # the fifth flip waits for the interval's end
    assert not gate.changed(0.1, lambda: "e")  # the same orderings: waits
    assert gate.dirty and gate.due(0.1) == pytest.approx(0.14)
    assert gate.changed(0.25, lambda: "e")  # an interval after the last publish: at once


def test_a_change_not_worth_a_flip_check_waits_for_the_interval_without_ranking() -> None:
    """A plain success is not ranked on arrival (the catalogue-wide ranking cost ~150 us a
    request): inside the interval it waits, after a quiet interval it goes at once."""
    gate = EvidenceGate(0.2, 4)
    gate.published("a", 0.0)
    assert not gate.changed(0.05, None)
    assert gate.dirty and gate.due(0.05) == pytest.approx(0.15)
    assert gate.changed(0.3, None)


def test_steering_checks_failures_and_allowance_use_for_flips_but_not_plain_successes() -> None:
    from actors.steering import SteeringActor
    from schemas.catalog import SteeringConfig

    models = (
        ModelConfig.model_validate({"id": "a"}),
        ModelConfig.model_validate(
            {"id": "b", "catalog": {"free_allowance": {"monthly_requests": 100}}}
        ),
    )
    actor = SteeringActor(models, (), SteeringConfig())

    assert not actor._may_flip(_obs("a", "success"))
    assert actor._may_flip(_obs("a", "failure", status=500))
    assert actor._may_flip(_obs("b", "success"))  # allowance use moves its multiplier


def test_initial_chains_start_configured_then_created_and_leave_out_deleted_ones() -> None:
    configured = (
        ChainConfig(name="kept", models=("a",)),
        ChainConfig(name="gone", org="acme", models=("b",)),
        ChainConfig(name="edited", backfill=True, models=("a", "b")),
    )
    edited = ChainState(name="edited", models=_chain(("b", True)))
    new = ChainState(name="new", models=_chain(("c", False)))

    out = initial_chains(configured, {"edited": edited, "new": new}, {"gone", "edited"})

    assert [c.name for c in out] == ["kept", "edited", "new"]
    assert out[0] == ChainState(name="kept", org="", backfill=False, models=_chain(("a", True)))
    assert out[1] is edited  # an admin deleted it, then created it again: as created
    assert out[2] is new


def test_month_of_names_the_utc_month_across_boundaries_in_any_order() -> None:
    end_of_november = calendar.timegm((2026, 11, 30, 23, 59, 59))
    new_year = calendar.timegm((2027, 1, 1, 0, 0, 0))
    asked = [
        (end_of_november, "2026-11"),
        (end_of_november + 1, "2026-12"),
        (new_year - 0.5, "2026-12"),
        (new_year, "2027-01"),
        (end_of_november, "2026-11"),  # a replay's clock may go back
        (0.0, "1970-01"),
    ]
    assert [month_of(t) for t, _ in asked] == [label for _, label in asked]


def test_settings_no_admin_changed_follow_the_file_and_an_admins_or_an_old_snapshots_win() -> None:
    file = SteeringState(profile="balanced", exploration=0.05)
    now = SteeringState(profile="fastest", exploration=0.2)
    admins = SteeringState(profile="smartest", exploration=0.05, chains=("x",), seq=7)
    as_saved = msgspec.structs.replace(file, chains=("x",), seq=3)

    assert starting_state(None, None, now) == now
    assert starting_state(as_saved, file, now) == now  # saved as the file gave it
    assert starting_state(admins, file, now) == admins  # an admin command changed it
    assert starting_state(as_saved, None, now) == as_saved  # saved before this was recorded
