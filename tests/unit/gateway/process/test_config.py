"""Config loading: one precise message naming the file, the key's path and why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from actors.strategies import register_missing_strategy, validate_strategy
from gateway.process.config import ConfigError, load_config, load_sections, parse_config
from gateway.process.shared_database import SharedDatabaseRequiredError, require_shared_database


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, source="gw.yaml", routers=validate_strategy)
    return str(exc.value)


def test_config_without_the_strategies_checks_only_the_router_fields_shape() -> None:
    # The ingress loads configs without the actors' strategies: the actors process (which
    # passes ``routers``) is the one that refuses an unknown router.
    text = "models: [{id: a, router: fastest, router_params: {x: 1}, route: [{kind: echo}]}]"
    assert parse_config(text).models[0].router == "fastest"
    with pytest.raises(ConfigError):
        parse_config("models: [{id: a, router: 7, route: [{kind: echo}]}]")


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
    msg = _error(
        "models: [{id: a, route: [{kind: openai_compat, base_url: 'http://x/v1', "
        "api_key: '${LLMGW_TEST_UNSET}'}]}]"
    )
    assert "models[0].route[0].api_key: environment variable LLMGW_TEST_UNSET is not set" in msg


def test_config_with_an_empty_env_var_names_the_variable_instead_of_a_keyless_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMGW_TEST_EMPTY", "")
    msg = _error(
        "models: [{id: a, route: [{kind: openai_compat, base_url: 'http://x/v1', "
        "api_key: '${LLMGW_TEST_EMPTY}'}]}]"
    )
    assert msg == (
        "gw.yaml: models[0].route[0].api_key: environment variable LLMGW_TEST_EMPTY "
        "is set but empty"
    )


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("api_key: ''", "models[0].route[0].api_key: String should have at least 1 character"),
        ("api_keys: ['k', '']", "models[0].route[0].api_keys: a key must not be empty"),
        ("api_keys: [{key: ''}]", "models[0].route[0].api_keys[0].key: String should have"),
    ],
)
def test_config_with_an_empty_route_key_is_refused_not_read_as_keyless(
    keys: str, says: str
) -> None:
    assert says in _error(
        f"models: [{{id: a, route: [{{kind: openai_compat, base_url: 'http://x/v1', {keys}}}]}}]"
    )


def test_config_env_var_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_TEST_KEY", "sk-abc")
    cfg = parse_config(
        "models: [{id: a, route: [{kind: openai_compat, "
        "base_url: 'http://x/v1', api_key: '${LLMGW_TEST_KEY}'}]}]"
    )
    assert cfg.models[0].route[0].secrets == ("sk-abc",)


def test_config_with_unknown_kind_lists_known_kinds() -> None:
    assert "'openai_compat', 'anthropic', 'echo', 'azure_openai', 'gemini' or 'bedrock'" in _error(
        "models: [{id: a, route: [{kind: grpc}]}]"
    )


def test_config_bedrock_route_defaults_to_its_regions_endpoint() -> None:
    cfg = parse_config(
        "models: [{id: a, route: [{kind: bedrock, bedrock: {region: eu-west-3},"
        " api_key: 'AKID:SECRET'}]}]"
    )
    (route,) = cfg.models[0].route
    assert route.base_url == "https://bedrock-runtime.eu-west-3.amazonaws.com"
    assert cfg.models[0].endpoint_ids() == ("a:bedrock-api",)


@pytest.mark.parametrize(
    ("route", "says"),
    [
        ("{kind: bedrock}", "bedrock: {region} is required"),
        ("{kind: bedrock, bedrock: {region: Mars}}", "region"),
        ("{kind: bedrock, bedrock: {region: us-east-1}, api_key: sk-1}", "ACCESS_KEY_ID"),
        ("{kind: openai_compat, base_url: 'http://x', bedrock: {region: us-east-1}}", "only for"),
    ],
)
def test_config_bedrock_settings_are_checked(route: str, says: str) -> None:
    assert says in _error(f"models: [{{id: a, route: [{route}]}}]")


_APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"


@pytest.mark.parametrize("model_id", [_APP_PROFILE, "us.anthropic.claude-sonnet-4-5-v1:0"])
def test_config_bedrock_model_family_is_read_for_an_opaque_or_claude_id(model_id: str) -> None:
    cfg = parse_config(
        f"models: [{{id: a, route: [{{kind: bedrock, provider_model_id: '{model_id}',"
        " bedrock: {region: us-east-1, model_family: anthropic}}]}]"
    )
    settings = cfg.models[0].route[0].bedrock
    assert settings is not None and settings.model_family == "anthropic"


@pytest.mark.parametrize(
    ("model_id", "family", "says"),
    [
        ("meta.llama3-8b-instruct-v1:0", "anthropic", "model_family: anthropic contradicts"),
        (
            "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0",
            "anthropic",
            "model_family: anthropic contradicts",
        ),
        (_APP_PROFILE, "meta", "route[0].bedrock.model_family: Input should be 'anthropic'"),
    ],
)
def test_config_bedrock_model_family_against_the_id_is_refused(
    model_id: str, family: str, says: str
) -> None:
    assert says in _error(
        f"models: [{{id: a, route: [{{kind: bedrock, provider_model_id: '{model_id}',"
        f" bedrock: {{region: us-east-1, model_family: {family}}}}}]}}]"
    )


def test_config_with_unknown_router_lists_known_routers() -> None:
    msg = _error("models: [{id: a, router: fastest, route: [{kind: echo}]}]")
    assert (
        "models[0].router: unknown router 'fastest'; known routers: fixed, greedy_cost, "
        "greedy_latency, round_robin, routewise"
    ) in msg


def test_config_with_unknown_router_param_is_refused() -> None:
    msg = _error(
        "models: [{id: a, router: round_robin, router_params: {strat: 1}, route: [{kind: echo}]}]"
    )
    assert "models[0].router_params" in msg and "strat" in msg


def test_config_with_unavailable_router_gives_the_reason() -> None:
    register_missing_strategy("needs_numpy_9", "numpy 9 is not installed")
    assert "router 'needs_numpy_9' is not available: numpy 9" in _error(
        "routing: {default_router: needs_numpy_9}"
    )


def test_config_routewise_as_default_router_is_accepted() -> None:
    cfg = parse_config(
        "routing: {default_router: routewise}\nmodels: [{id: a, route: [{kind: echo}]}]"
    )
    assert cfg.routing.default_router == "routewise"


def test_config_routewise_resource_key_names_its_route_level_replacement() -> None:
    msg = _error(
        "models: [{id: a, router: routewise, router_params: {quota_limit: 5}, "
        "route: [{kind: echo}]}]"
    )
    assert "models[0].router_params" in msg
    assert "'quota_limit' is no longer a router_params key: set route `quota: {limit}`" in msg


def test_config_routewise_concurrency_key_names_its_replacement() -> None:
    msg = _error(
        "models: [{id: a, router: routewise, router_params: {concurrency_limit: 2}, "
        "route: [{kind: echo}]}]"
    )
    assert "route `concurrency: {limit}`" in msg


def test_config_routewise_bad_param_value_is_refused_without_quoting_it() -> None:
    msg = _error(
        "models: [{id: a, router: routewise, router_params: "
        "{budget_alpha: 1.7}, route: [{kind: echo}]}]"
    )
    assert "budget_alpha" in msg and "1.7" not in msg


def test_config_routewise_model_of_quota_routes_only_fails_naming_the_fix() -> None:
    msg = _error(
        "models: [{id: subs, router: routewise, route: [{kind: openai_compat, "
        "base_url: 'http://127.0.0.1:9/v1', provider_type: quota, quota: {limit: 5}, "
        "quota_source: {kind: local}}]}]"
    )
    assert "model 'subs' has only quota routes" in msg
    assert "envelope_bootstrap_donor_models" in msg and "on-demand route" in msg


def test_config_routewise_quota_only_model_with_donors_starts() -> None:
    cfg = parse_config(
        "models: [{id: subs, router: routewise, router_params: "
        "{envelope_bootstrap_donor_models: [other]}, route: [{kind: "
        "openai_compat, base_url: 'http://127.0.0.1:9/v1', provider_type: quota, "
        "quota: {limit: 5}, quota_source: {kind: local}}]}]"
    )
    assert cfg.models[0].router == "routewise"


def test_config_with_duplicate_alias_is_refused() -> None:
    assert "declared twice" in _error(
        "models: [{id: a, route: [{kind: echo}]}, {id: b, aliases: [a], route: [{kind: echo}]}]"
    )


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


@pytest.mark.parametrize(
    ("base_url", "says"),
    [
        ("http://", "names no host"),
        ("https:///v1", "names no host"),
        ("http://:8000/v1", "names no host"),
        ("http://127.0.0.1:99999/v1", "has an invalid port"),
        ("http://127.0.0.1:0/v1", "has an invalid port"),
        ("http://127.0.0.1:http/v1", "has an invalid port"),
        ("http://host/v1?a=b#frag", "must not have a query"),
        ("http://host/v1?", "must not have a query"),
        ("http://host/v1#frag", "must not have a query (?...) or a fragment (#...)"),
        ("ftp://host/v1", "must be an http:// or https:// URL"),
        # Once dropped before sending (the upstream said 401) and shown on /routing.
        ("http://ops:sk-pw-0123@host:8000/v1", "must not carry credentials"),
        ("https://sk-token-0123@host/v1", "must not carry credentials"),
    ],
)
def test_config_with_an_unusable_base_url_is_refused_naming_its_path(
    base_url: str, says: str
) -> None:
    msg = _error(
        "models: [{id: a, route: [{kind: echo}]}, "
        f"{{id: m, route: [{{kind: echo}}, {{kind: openai_compat, base_url: '{base_url}'}}]}}]"
    )
    assert msg.startswith("gw.yaml: models[1].route[1].base_url: "), msg
    assert says in msg and base_url not in msg, msg


@pytest.mark.parametrize(
    "base_url", ["http://[::1]:8000/v1", "https://host:443", "http://host:/v1", "http://h/v1/"]
)
def test_config_base_url_with_a_host_and_port_or_none_is_accepted(base_url: str) -> None:
    cfg = parse_config(
        f"models: [{{id: m, route: [{{kind: openai_compat, base_url: '{base_url}'}}]}}]"
    )
    assert cfg.models[0].route[0].base_url == base_url


def test_two_routes_at_one_place_get_distinct_endpoint_ids() -> None:
    cfg = parse_config(
        "models: [{id: m, route: [{kind: openai_compat, base_url: "
        "'http://127.0.0.1:1/v1'}, {kind: openai_compat, "
        "base_url: 'http://127.0.0.1:1/v1'}]}]"
    )
    assert cfg.models[0].endpoint_ids() == ("m:local-1", "m:local-1-2")


SECRET = "sk-live-0123456789abcdef"
_ROUTE = (
    "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://x/v1\n"
)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (_ROUTE + f'        api_key: "{SECRET}\n', "line 7, column 1"),  # unterminated quote
        (_ROUTE + f"        api_key: '{SECRET}\n", "line 7, column 1"),
        (_ROUTE + f"        api_key: {SECRET}: x\n", "line 6, column "),
        (_ROUTE + f'        api_key: "\\q{SECRET}"\n', "line 6, column "),  # unknown escape
        (_ROUTE + f'        api_key: "\\x{SECRET}"\n', "line 6, column "),  # bad hex escape
        (_ROUTE + f"        api_key: *{SECRET}\n", "line 6, column 18"),  # undefined alias
        (_ROUTE + f"        api_key: !{SECRET} x\n", "line 6, column 18"),  # unknown tag
        (_ROUTE + f"       api_key: {SECRET}\n", "line 6, column "),  # bad indentation
        (f'admin_key: "{SECRET}\x07"\n', "line 1, column 37"),  # a control character
    ],
)
def test_config_with_yaml_syntax_error_gives_line_and_column_never_the_text(
    text: str, where: str
) -> None:
    msg = _error(text)
    assert msg.startswith(f"gw.yaml: {where}") and ": not valid YAML: " in msg, msg
    assert SECRET not in msg and SECRET[:8] not in msg and "api_key" not in msg, msg
    assert "\n" not in msg and "^" not in msg, msg


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "server: {port: 9001}\nmodels: []\nserver: {host: 0.0.0.0}\n",
            "gw.yaml: line 3, column 1: not valid YAML: "
            "server is given twice in one mapping (first on line 1)",
        ),
        (
            _ROUTE + "        weight: 1\n        weight: 2\n",
            "gw.yaml: line 7, column 9: not valid YAML: "
            "weight is given twice in one mapping (first on line 6)",
        ),
        (
            f"routing: {{{SECRET}: 1, {SECRET}: 2}}\n",
            "gw.yaml: line 1, column 40: not valid YAML: "
            "a key is given twice in one mapping (first on line 1)",
        ),
    ],
    ids=["a-section", "a-route-field", "a-key-never-quoted"],
)
def test_config_with_a_key_given_twice_is_refused_naming_where(text: str, says: str) -> None:
    """PyYAML keeps a repeated key's last value: a second ``server:`` section silently
    dropped the first's port, and the gateway listened on 8080."""
    assert _error(text) == says


def test_config_key_repeated_through_a_merge_is_an_override() -> None:
    cfg = parse_config(
        "models:\n  - id: m\n    route:\n      - &r {kind: echo, weight: 1}\n"
        "  - id: n\n    route:\n      - {<<: *r, weight: 2}\n"
    )
    assert [m.route[0].weight for m in cfg.models] == [1, 2]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            _ROUTE + f"        api_keys: [{{key: {SECRET}, min_role: boss}}]\n",
            "gw.yaml: models[0].route[0].api_keys[0].min_role: "
            "Input should be 'free', 'pro', 'internal' or 'admin'",
        ),
        (
            "models: [{id: m, route: [{kind: echo}]}]\n"
            "chains: [{name: c, models: [m, {model: m, enabled: maybe}]}]\n",
            "gw.yaml: chains[0].models[1].enabled: "
            "Input should be a valid boolean, unable to interpret input",
        ),
    ],
    ids=["a-key-s-role", "a-chain-entry"],
)
def test_config_entry_given_as_a_mapping_is_refused_naming_its_own_problem(
    text: str, says: str
) -> None:
    """Each said ``...api_keys[0].str: Input should be a valid string (and 1 more
    problems)``: that the mapping is no string, not what is wrong in it."""
    assert _error(text) == says


def test_config_yaml_error_names_the_problem_and_where_its_context_began() -> None:
    msg = _error(_ROUTE + f'        api_key: "{SECRET}\n')
    assert msg == (
        "gw.yaml: line 7, column 1: not valid YAML: found unexpected end of stream "
        "(while scanning a quoted scalar at line 6, column 18)"
    )


def test_config_yaml_error_keeps_the_syntax_tokens_it_expected() -> None:
    msg = _error("{a: 1\n")
    assert "expected ',' or '}', but got '<stream end>'" in msg, msg


@pytest.mark.parametrize(
    "text",
    [
        _ROUTE + f"        api_key: [{SECRET}]\n",
        _ROUTE + f"        api_keys: [{{key: {SECRET}, min_role: {SECRET}}}]\n",
        _ROUTE + f"        weight: {SECRET}\n",
        _ROUTE + f"        timeout_seconds: {SECRET}\n",
        _ROUTE + f"        kind: {SECRET}\n",
        f"models: [{{id: m, route: [{{kind: openai_compat, base_url: {SECRET}}}]}}]",
        f"bus: {{url: {SECRET}}}",
        f"auth: {SECRET}",
        f"server: {SECRET}",
    ],
)
def test_config_validation_error_never_quotes_the_value(text: str) -> None:
    msg = _error(text)
    assert msg.startswith("gw.yaml: ") and SECRET not in msg, msg


def test_config_env_override_error_never_quotes_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CIRCUIT_COOLDOWN_SECONDS", SECRET)
    msg = _error("models: []")
    assert "routing.circuit.cooldown_seconds" in msg and SECRET not in msg, msg


def test_config_routewise_example_in_docs_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_KEY", "adm-docs")
    cfg = load_config(Path(__file__).resolve().parents[4] / "docs" / "routewise-example.yaml")
    assert cfg.models[0].router == "routewise"
    assert [r.provider_type for r in cfg.models[0].route] == ["on_demand", "on_demand", "quota"]


def test_config_database_url_must_be_postgresql_and_never_shows_in_repr() -> None:
    config = parse_config("database: {url: 'postgresql://gw:s3cret-pw@db:5432/llmgw'}")
    assert config.database.url == "postgresql://gw:s3cret-pw@db:5432/llmgw"
    assert "s3cret-pw" not in repr(config)
    msg = _error("database: {url: 'mysql://gw:s3cret-pw@db/llmgw'}")
    assert "database.url" in msg and "postgresql://" in msg and "s3cret-pw" not in msg


def test_config_database_url_env_var_wins_and_reaches_the_operator_commands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMGW_DATABASE_URL", "postgresql://gw:pw@db/from-env")
    file = tmp_path / "gw.yaml"
    file.write_text("database: {path: x.db, url: 'postgresql://gw:pw@db/from-file'}\n")
    assert load_config(file).database.url == "postgresql://gw:pw@db/from-env"
    picked = load_sections(file, "bus", "database").database
    assert (picked.path, picked.url) == ("x.db", "postgresql://gw:pw@db/from-env")
    monkeypatch.setenv("LLMGW_DATABASE_URL", "sqlite:///s3cret-pw")
    with pytest.raises(ConfigError) as exc:
        load_config(file)
    assert "LLMGW_DATABASE_URL" in str(exc.value) and "s3cret-pw" not in str(exc.value)


def test_a_second_actor_host_without_a_shared_database_is_refused_naming_the_remedy() -> None:
    sqlite = parse_config("database: {path: /var/lib/llmgw/gw.db}")
    require_shared_database(sqlite, {"node-a"}, node_id="node-a")  # alone: the file will do
    with pytest.raises(SharedDatabaseRequiredError) as exc:
        require_shared_database(sqlite, {"node-a", "node-b"}, node_id="node-a")
    msg = str(exc.value)
    assert "node-b" in msg and "/var/lib/llmgw/gw.db" in msg
    assert "database.url: postgresql://" in msg and "LLMGW_DATABASE_URL" in msg
    shared = parse_config("database: {url: 'postgresql://gw@db/llmgw'}")
    require_shared_database(shared, {"node-a", "node-b"}, node_id="node-a")
    no_log = parse_config("log: {enabled: false}")
    require_shared_database(no_log, {"node-a", "node-b"}, node_id="node-a")


def test_config_load_warns_once_naming_the_unpriced_routes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.process.actor_host import load_checked_config

    path = tmp_path / "gw.yaml"
    path.write_text(
        "models: [{id: m, route: [{kind: echo}, {kind: openai_compat, base_url: 'http://a'},"
        " {kind: openai_compat, base_url: 'http://b', pricing: {prompt: 0, completion: 0}},"
        " {kind: openai_compat, base_url: 'http://c', pricing: {prompt: 1, completion: 2}}]}]"
    )
    unpriced = load_checked_config(str(path)).models[0].endpoint_ids()[1]  # echo: nothing to bill
    warnings = [r for r in caplog.records if "no pricing" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert warnings[0].getMessage().endswith(f": {unpriced}")  # the priced ones are not named


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("models: [{id: a, route: [{kind: echo, weight: .inf}]}]", "models[0].route[0].weight"),
        (
            "models: [{id: a, route: [{kind: echo, pricing: {prompt: .inf, completion: 1}}]}]",
            "models[0].route[0].pricing.prompt",
        ),
        ("database: {path: ''}", "database.path"),
    ],
    ids=["an-infinite-weight", "an-infinite-price", "an-empty-database-path"],
)
def test_a_value_no_setting_can_hold_is_refused_naming_it(text: str, path: str) -> None:
    """Each was taken: an infinite weight crashed the routing admin's answer, an infinite
    price the request log's batches (no JSON number holds it), an empty database path the
    start (after the actors started) with a traceback."""
    assert _error(text).startswith(f"gw.yaml: {path}: ")


@pytest.mark.parametrize(
    "text",
    ["chains: &c [*c]", "models: " + "[" * 5000 + "]" * 5000],
    ids=["an-alias-holding-itself", "five-thousand-levels"],
)
def test_a_config_nested_past_reading_is_refused_in_one_line(text: str) -> None:
    """Both ended in a RecursionError traceback (and, on a reload, a crash of its owner)."""
    msg = _error(text)
    assert msg.startswith("gw.yaml: nested too deeply") and "\n" not in msg


def test_aliases_repeating_aliases_are_refused_before_they_expand() -> None:
    """Six levels of ten aliases made a million values from 500 bytes (1.6 s, 81 MB); each
    level more, ten times that."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, 8):
        lines.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    assert _error("\n".join(lines)) == "gw.yaml: expands to more than 1,000,000 values (aliases)"


@pytest.mark.parametrize(
    "key", ["sk-proj-SUPERSECRETKEY123", "evil\nINFO fake log line"], ids=["a-secret", "a-line"]
)
def test_an_unknown_key_no_field_could_be_named_is_not_quoted(key: str) -> None:
    """The refusal quoted it: a secret pasted where a key goes reached stderr, the reload's
    answer and the log, and a line break forged a second log line."""
    msg = _error(f"models: [{{id: a, route: [{{kind: echo, {json.dumps(key)}: 1}}]}}]")
    assert msg == "gw.yaml: models[0].route[0].<a key>: Extra inputs are not permitted"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('models: [{id: "m\\nx", route: [{kind: echo}]}]', "models[0].id"),
        ('models: [{id: a, aliases: ["b\\u202e"], route: [{kind: echo}]}]', "models[0].aliases[0]"),
        ('admin_key: "adm\\nxyz"', "admin_key"),
        (
            'models: [{id: a, route: [{kind: openai_compat, base_url: "http://x", '
            'api_key: "sk-1\\nfoo"}]}]',
            "models[0].route[0].api_key",
        ),
        (
            'models: [{id: a, route: [{kind: openai_compat, base_url: "http://x", '
            'api_keys: ["sk-1", "sk-2\\r"]}]}]',
            "models[0].route[0].api_keys[1]",
        ),
        (
            'models: [{id: a, route: [{kind: openai_compat, base_url: "http://x", '
            'api_keys: [{key: "sk-1\\u0000"}]}]}]',
            "models[0].route[0].api_keys[0].key",
        ),
    ],
    ids=["a-model-id", "an-alias", "the-admin-key", "a-key", "a-pool-key", "a-reserved-key"],
)
def test_a_control_character_in_a_key_or_an_id_is_refused_without_quoting_it(
    text: str, path: str
) -> None:
    """A key with a line break made every request a 500 (no header holds it), an admin key
    with one could never match, an id with one split the reload's log lines."""
    msg = _error(text)  # a pool's key may also be a mapping: that problem is counted too
    assert msg.startswith(f"gw.yaml: {path}: must not contain control characters or line ")


def test_the_readmes_configuration_reference_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """It did not: one route gave ``pricing`` twice, a chain named a model the file does not
    declare, and ``free_allowance`` showed a value the loader refuses (both counts null)."""
    readme = (Path(__file__).parents[4] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Configuration reference") :]
    start = section.index("```yaml\n") + len("```yaml\n")
    text = section[start : section.index("```", start)]
    for name in set(re.findall(r"\$\{([A-Z0-9_]+)\}", text)):
        monkeypatch.setenv(name, "sk-readme-0123")
    config = parse_config(text, source="README.md", routers=validate_strategy)
    assert [model.id for model in config.models] == ["my-model"]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "models: [{id: a, route: [{kind: echo, input_modalities: [text, images]}]}]",
            "models[0].route[0].input_modalities[1]",
        ),
        ("models: [{id: a, aliases: [''], route: [{kind: echo}]}]", "models[0].aliases[0]"),
        ("routing: {health_check: {path: health}}", "routing.health_check.path"),
    ],
    ids=["an-unknown-modality", "an-empty-alias", "a-probe-path-without-its-slash"],
)
def test_a_setting_that_would_do_nothing_is_refused_naming_it(text: str, path: str) -> None:
    """Each was taken without a word: a route given ``images`` never took an image request,
    no request can name an empty alias, a probe of ``health`` asked no path of the server."""
    assert _error(text).startswith(f"gw.yaml: {path}: ")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("server: {port: true}", "server: port"),
        ("routing: {failover: {max_attempts: yes}}", "routing.failover: max_attempts"),
        ("limits: {decision_timeout_seconds: false}", "limits: decision_timeout_seconds"),
        ("models: [{id: a, route: [{kind: echo, weight: true}]}]", "models[0].route[0]: weight"),
        (
            "models: [{id: a, route: [{kind: echo, pricing: {prompt: true}}]}]",
            "models[0].route[0].pricing: prompt",
        ),
        (
            "models: [{id: a, catalog: {price: {input_per_mtok: no}}, route: [{kind: echo}]}]",
            "models[0].catalog.price: input_per_mtok",
        ),
    ],
)
def test_config_refuses_true_or_false_where_a_number_goes(text: str, where: str) -> None:
    # pydantic reads them as 1 and 0: ``port: true`` listened on port 1, and a YAML ``yes``
    # (a boolean in YAML 1.1) was one attempt.
    assert _error(text) == f"gw.yaml: {where} takes a number, not true or false"


def test_config_still_takes_numbers_and_booleans_where_they_go() -> None:
    config = parse_config(
        "server: {port: 8081}\nrouting: {affinity: {enabled: yes}, failover: {max_attempts: 2}}"
    )
    assert config.server.port == 8081
    assert config.routing.affinity.enabled is True
    assert config.routing.failover.max_attempts == 2


def test_config_paths_into_a_tagged_union_name_no_tag() -> None:
    # pydantic puts the member's tag after the field (``quota_source.local.limit``): no key
    # of the file, as a union member's type name is none.
    msg = _error("models: [{id: a, route: [{kind: echo, quota_source: {kind: local, limit: 5}}]}]")
    assert msg.startswith("gw.yaml: models[0].route[0].quota_source.limit: Extra inputs")
