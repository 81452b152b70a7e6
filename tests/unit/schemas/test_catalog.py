"""Steering config: catalogue entries, chains and the steering section, validated at startup
with one message naming the key's path."""

from __future__ import annotations

import pytest

from gateway.process.config import ConfigError, parse_config

_MODELS = """
models:
  - {id: a, route: [{kind: echo}], catalog: {tier: 3, rank: 2, price: {input_per_mtok: 1},
     free_allowance: {monthly_tokens: 1000}, enabled: false}}
  - {id: b, route: [{kind: echo}]}
"""


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(_MODELS + text, source="gw.yaml")
    return str(exc.value)


def test_catalogue_chains_and_steering_are_read_with_neutral_defaults() -> None:
    cfg = parse_config(
        _MODELS
        + """
chains:
  - {name: Coding, org: acme, backfill: true, models: [b, {model: a, enabled: false}]}
  - {name: shared}
steering: {active_chain: SHARED, profile: custom, weights: [0.2, 0.3, 0.5],
           guardrails: {allowance_threshold: 0.9}, exploration: 0}
"""
    )
    a, b = cfg.models
    assert (a.catalog.tier, a.catalog.rank, a.catalog.enabled) == (3, 2, False)
    assert a.catalog.free_allowance is not None and a.catalog.free_allowance.monthly_tokens == 1000
    assert (b.catalog.tier, b.catalog.rank, b.catalog.price, b.catalog.enabled) == (
        1,
        1,
        None,
        True,
    )
    chain = cfg.chains[0]
    assert chain.name == "coding" and chain.org == "acme" and chain.backfill
    assert [(e.model, e.enabled) for e in chain.entries()] == [("b", True), ("a", False)]
    assert cfg.steering.active_chain == "shared"
    assert cfg.steering.guardrails.allowance_threshold == 0.9
    assert cfg.steering.guardrails.rate_limit_penalty == 0.5


@pytest.mark.parametrize(
    "name", ["fastest", "FAST", "speed", "budget", "smart", "auto", "reliable", "cheap"]
)
def test_chain_named_like_an_axis_or_synonym_is_refused(name: str) -> None:
    assert "chains[0].name" in (msg := _error(f"chains: [{{name: {name}}}]"))
    assert "taken by an axis" in msg


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ("chains: [{name: c, models: [nope]}]", "(top level)", "'nope', which is no model id"),
        ("chains: [{name: c}, {name: C}]", "(top level)", "declared twice"),
        ("chains: [{name: c, models: [a, a]}]", "(top level)", "names a model twice"),
        ("chains: [{name: 'a b'}]", "chains[0].name", "must be 1-64"),
        ("chains: [{name: c, colour: red}]", "chains[0].colour", "Extra inputs"),
        ("steering: {active_chain: missing}", "(top level)", "no chain of chains"),
        (
            "chains: [{name: c, org: acme}]\nsteering: {active_chain: c}",
            "(top level)",
            "must be deployment-wide",
        ),
        ("steering: {profile: custom, weights: [0.5, 0.5, 0.5]}", "steering", "sum to 1"),
        ("steering: {profile: custom}", "steering", "needs weights"),
        ("steering: {profile: balanced, weights: [1, 0, 0]}", "steering", "only read with"),
        ("steering: {profile: cleverest}", "steering.profile", "Input should be"),
        ("steering: {exploration: 2}", "steering.exploration", "less than or equal to 1"),
        (
            "steering: {guardrails: {allowance_floor: -1}}",
            "steering.guardrails.allowance_floor",
            "greater than or equal",
        ),
    ],
)
def test_bad_steering_config_names_the_key(text: str, where: str, why: str) -> None:
    msg = _error(text)
    assert f"gw.yaml: {where}" in msg and why in msg, msg


def test_catalogue_key_errors_name_the_model_path() -> None:
    msg = _error("  - {id: c, route: [{kind: echo}], catalog: {free_allowance: {}}}\n")
    assert "models[2].catalog.free_allowance" in msg and "monthly_tokens" in msg
    assert "models[2].catalog.colour" in _error(
        "  - {id: c, route: [{kind: echo}], catalog: {colour: red}}\n"
    )


def test_model_named_auto_is_refused() -> None:
    assert "taken by steering" in _error("  - {id: Auto, route: [{kind: echo}]}\n")
    assert "taken by steering" in _error(
        "  - {id: c, aliases: ['auto:x'], route: [{kind: echo}]}\n"
    )
