"""Config loading: one precise message naming the file, the key's path and why."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load_config, parse_config


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, source="gw.yaml")
    return str(exc.value)


def test_config_with_mistyped_weight_names_file_and_path() -> None:
    msg = _error("""
models:
  - {id: a, route: [{kind: echo}]}
  - {id: b, route: [{kind: echo}]}
  - {id: c, route: [{kind: echo, weight: heavy}]}
""")
    assert msg.startswith("gw.yaml: models[2].route[0].weight: ")


def test_config_with_unknown_key_is_refused() -> None:
    assert "models[0].route[0].wieght: Extra inputs are not permitted" in _error(
        "models: [{id: a, route: [{kind: echo, wieght: 1}]}]"
    )


def test_config_with_missing_env_var_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGW_TEST_UNSET", raising=False)
    msg = _error("models: [{id: a, route: [{kind: openai_compat, base_url: 'http://x/v1', "
                 "api_key: '${LLMGW_TEST_UNSET}'}]}]")
    assert "models[0].route[0].api_key: environment variable LLMGW_TEST_UNSET is not set" in msg


def test_config_env_var_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_TEST_KEY", "sk-abc")
    cfg = parse_config("models: [{id: a, route: [{kind: openai_compat, "
                       "base_url: 'http://x/v1', api_key: '${LLMGW_TEST_KEY}'}]}]")
    assert cfg.models[0].route[0].secrets == ("sk-abc",)


def test_config_with_unknown_kind_lists_known_kinds() -> None:
    assert "'openai_compat', 'anthropic' or 'echo'" in _error(
        "models: [{id: a, route: [{kind: grpc}]}]")


def test_config_with_unknown_router_lists_known_routers() -> None:
    msg = _error("models: [{id: a, router: fastest, route: [{kind: echo}]}]")
    assert "models[0].router: unknown router 'fastest'; known routers: fixed, round_robin" in msg


def test_config_with_unknown_router_param_is_refused() -> None:
    msg = _error("models: [{id: a, router: round_robin, router_params: {strat: 1}, "
                 "route: [{kind: echo}]}]")
    assert "models[0].router_params" in msg and "strat" in msg


def test_config_with_unavailable_router_gives_the_reason() -> None:
    assert "router 'routewise' is not available" in _error(
        "routing: {default_router: routewise}")


def test_config_with_duplicate_alias_is_refused() -> None:
    assert "declared twice" in _error(
        "models: [{id: a, route: [{kind: echo}]}, {id: b, aliases: [a], route: [{kind: echo}]}]")


def test_config_circuit_env_vars_override_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CIRCUIT_FAILURE_THRESHOLD", "5")
    monkeypatch.setenv("CIRCUIT_COOLDOWN_SECONDS", "2.5")
    cfg = parse_config("routing: {circuit: {failure_threshold: 2}}")
    assert cfg.routing.circuit.failure_threshold == 5
    assert cfg.routing.circuit.cooldown_seconds == 2.5


def test_config_invalid_circuit_env_var_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CIRCUIT_FAILURE_THRESHOLD", "many")
    assert "environment override of routing.circuit.failure_threshold" in _error("{}")


def test_config_file_that_does_not_exist_names_it(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load_config("nope.yaml")


def test_bundled_demo_config_serves_demo_on_echo() -> None:
    cfg = load_config(None)
    assert cfg.models[0].id == "demo"
    assert cfg.models[0].endpoint_ids() == ("demo:echo",)


@pytest.mark.parametrize(
    ("base_url", "kind", "expected"),
    [
        ("http://localhost:8000/v1", "openai_compat", "m:local-8000"),
        ("http://127.0.0.1:9000/v1", "openai_compat", "m:local-9000"),
        ("https://api.minimax.io/v1", "openai_compat", "m:minimax-api"),
        ("https://api.openai.com/v1", "openai_compat", "m:openai-api"),
        ("https://api.anthropic.com", "anthropic", "m:anthropic-api"),
    ],
)
def test_endpoint_id_follows_the_spec_rule(base_url: str, kind: str, expected: str) -> None:
    cfg = parse_config(f"models: [{{id: m, route: [{{kind: {kind}, base_url: '{base_url}'}}]}}]")
    assert cfg.models[0].endpoint_ids() == (expected,)


def test_two_routes_at_one_place_get_distinct_endpoint_ids() -> None:
    cfg = parse_config("models: [{id: m, route: [{kind: openai_compat, base_url: "
                       "'http://127.0.0.1:1/v1'}, {kind: openai_compat, "
                       "base_url: 'http://127.0.0.1:1/v1'}]}]")
    assert cfg.models[0].endpoint_ids() == ("m:local-1", "m:local-1-2")
