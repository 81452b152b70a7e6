"""The admin API's refusals through the real server: a method a limit subject has no verb
for, JSON nested too deeply for explain and the routing rules, numbers no argument can hold
(NaN, infinities, integers past int64: a 400 naming the field, over HTTP and over the bus as
``llmgw admin`` sends them, and the owner keeps answering), an unknown admin area (404, not
"no responders"), and what a client reads while the actors are down (no bus subject)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import openai
import pytest

from gateway.admin.http import admin_request
from schemas import InvalidRequestError
from tests.e2e.conftest import (
    CHAT,
    HI,
    WAIT,
    assert_openai_error,
    chat,
    config,
    eid,
    gateway_bus,
    model,
    route,
)
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

ADMIN = "adm-errors-key"
AUTH = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}


@pytest.fixture
async def gw(gateway_factory: GatewayFactory) -> RunningGateway:
    """A gateway with an echo model ``m`` and an admin key."""
    return await gateway_factory(config(model("m", {"kind": "echo"}), admin_key=ADMIN))


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_clause(depth: int) -> dict[str, Any]:
    clause: dict[str, Any] = {"metadata.job": "batch"}
    for _ in range(depth):
        clause = {"$and": [clause]}
    return clause


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_a_limit_subject_answers_a_method_it_has_no_verb_for_with_a_4xx(
    gw: RunningGateway, method: str
) -> None:
    resp = await gw.http().request(method, "/admin/limits/org/acme", headers=AUTH, json={})

    assert 400 <= resp.status_code < 500, resp.text
    assert resp.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
async def test_explain_of_a_deeply_nested_body_is_400(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    caplog.set_level(logging.WARNING)
    inner = '{"model": "m", "messages": ' + json.dumps(HI) + ', "x": ' + _deep(depth) + "}"
    described = '{"body": ' + inner + "}"

    whole = await gw.http().post("/admin/routing/explain", content=_deep(depth), headers=AUTH)
    nested = await gw.http().post("/admin/routing/explain", content=described, headers=AUTH)

    for resp in (whole, nested):
        assert_openai_error(resp, 400, "invalid_request")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("depth", [1_000, 5_000, 40_000])  # 40,000 fits the body limit
async def test_a_deeply_nested_rule_set_is_400_and_changes_nothing(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    caplog.set_level(logging.WARNING)
    path = "/api/fallback/routing-rules"
    rule = {"name": "deep", "when": _deep_clause(depth // 2), "route": "auto:cheapest"}
    http = gw.http()

    whole = await http.put(path, content='{"rules": ' + _deep(depth) + "}", headers=AUTH)
    try:
        one_rule = json.dumps({"rules": [rule]})
    except RecursionError:  # the test's own encoder: build the text by hand
        one_rule = (
            '{"rules": [{"name": "deep", "route": "auto:cheapest", "when": '
            + '{"$and": [' * (depth // 2)
            + '{"metadata.job": "batch"}'
            + "]}" * (depth // 2)
            + "}]}"
        )
    deep_rule = await http.put(path, content=one_rule, headers=AUTH)
    after = await http.get(path, headers=AUTH)

    for resp in (whole, deep_rule):
        assert "nested" in assert_openai_error(resp, 400, "invalid_request")["message"]
    assert after.status_code == 200 and after.json()["rules"] == []
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


HUGE = 10**400  # a JSON integer literal: msgspec decodes it to an int no float can hold
WEIGHT = "/admin/routing/weights/m/"
# id: (method, path or "" for the model's weight, body, the param named)
BAD_NUMBERS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "spend_since_nan": ("POST", "/admin/spend/report", {"since": "nan"}, "since"),
    "spend_since_inf": ("POST", "/admin/spend/report", {"since": "-inf"}, "since"),
    "spend_since_ages_ago": (
        "POST",
        "/admin/spend/report",
        {"since": "99999999999999999999d"},
        "since",
    ),
    "spend_until_1e400": ("POST", "/admin/spend/report", {"until": "1e400"}, "until"),
    "spend_since_huge": ("POST", "/admin/spend/report", {"since": HUGE}, "since"),
    "log_since_nan": ("POST", "/admin/log/query", {"since": "NaN"}, "since"),
    "log_status_huge": ("POST", "/admin/log/query", {"status": 10**30}, "status"),
    "weight_huge": ("PUT", "", {"weight": HUGE}, "weight"),
    "weight_too_big": ("PUT", "", {"weight": 1e300}, "weight"),
    "limit_rpm_huge": ("PUT", "/admin/limits/org/o1", {"rpm": 10**30}, "rpm"),
    "limit_budget_inf": ("PUT", "/admin/limits/org/o1", {"budget": "inf/month"}, "budget"),
    "limit_budget_usd_huge": ("PUT", "/admin/limits/org/o1", {"budget_usd": HUGE}, "budget_usd"),
    "key_expires_in_nan": (
        "POST",
        "/admin/keys",
        {"role": "free", "org": "o", "user": "u", "expires_in": "nan"},
        "expires_in",
    ),
    "decay_huge": (
        "POST",
        "/admin/steering/set_guardrails",
        {"rate_limit_decay_seconds": HUGE},
        "rate_limit_decay_seconds",
    ),
}


@pytest.fixture
async def routed_gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m`` on the fake upstream and an admin key."""
    return await gateway_factory(config(model("m", route(fake_upstream)), admin_key=ADMIN))


@pytest.mark.parametrize(
    ("method", "path", "body", "param"), BAD_NUMBERS.values(), ids=BAD_NUMBERS.keys()
)
async def test_an_admin_number_no_argument_can_hold_is_400_naming_it_and_the_owner_lives_on(
    routed_gw: RunningGateway,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    caplog.set_level(logging.WARNING)
    http = routed_gw.http()
    path = path or WEIGHT + eid("m", fake_upstream).removeprefix("m:")

    resp = await http.request(method, path, content=json.dumps(body), headers=AUTH)
    report = await http.post("/admin/spend/report", json={"since": "1h"}, headers=AUTH)
    weights = await http.post("/admin/routing/weights", json={}, headers=AUTH)
    limits = await http.get("/admin/limits", headers=AUTH)

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param and param in err["message"], err
    assert len(err["message"]) < 300
    for after in (report, weights, limits):
        assert after.status_code == 200, after.text
    assert limits.json()["limits"] == {}
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


# What ``llmgw admin`` may put on the bus that the HTTP edge never passes on (an integer past
# int64): the owner refuses it itself. id: (area, verb, args, the param named)
BAD_ON_THE_BUS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "spend_since_huge": ("spend", "report", {"since": HUGE}, "since"),
    "spend_since_nan": ("spend", "report", {"since": "nan"}, "since"),
    "log_status_huge": ("log", "query", {"status": HUGE}, "status"),
    "weight_huge": ("routing", "set_weight", {"model": "m", "weight": HUGE}, "weight"),
    "limit_rpm_huge": ("limits", "set", {"subject": "org:o1", "rpm": HUGE}, "rpm"),
    "profile_weights_huge": (
        "steering",
        "set_profile",
        {"profile": "custom", "weights": [HUGE, 0, 0]},
        "weights",
    ),
    "decay_huge": (
        "steering",
        "set_guardrails",
        {"rate_limit_decay_seconds": HUGE},
        "rate_limit_decay_seconds",
    ),
}


@pytest.mark.parametrize(
    ("area", "verb", "args", "param"), BAD_ON_THE_BUS.values(), ids=BAD_ON_THE_BUS.keys()
)
async def test_an_admin_command_on_the_bus_with_a_number_out_of_range_is_refused_naming_it(
    routed_gw: RunningGateway,
    fake_upstream: FakeUpstream,
    area: str,
    verb: str,
    args: dict[str, Any],
    param: str,
) -> None:
    bus = gateway_bus(routed_gw)
    if area == "routing":
        args = {**args, "endpoint": eid("m", fake_upstream)}

    with pytest.raises(InvalidRequestError) as caught:
        await admin_request(bus, area, verb, args, by="test", timeout=WAIT)
    after = await admin_request(bus, "spend", "report", {"since": "1h"}, by="test", timeout=WAIT)

    assert caught.value.param == param, caught.value.message
    assert after["groups"] == []  # the owner still answers


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_unknown_admin_area_is_404_without_retry_after(
    gw: RunningGateway, method: str
) -> None:
    resp = await gw.http().request(method, "/admin/nope/show", headers=AUTH)

    err = assert_openai_error(resp, 404)
    assert "'nope'" in err["message"]
    assert "retry-after" not in resp.headers


async def test_an_admin_path_is_percent_decoded_once_so_an_escaped_percent_stays_a_percent(
    gw: RunningGateway,
) -> None:
    # The server decodes the path; the handlers decoded it again, so ``a%2541`` (the org
    # ``a%41``) set the limit of the org ``aA``, and ``li%2573t`` ran ``list``.
    client = gw.http()
    resp = await client.put("/admin/limits/org/a%2541", headers=AUTH, json={"rpm": 5})
    assert resp.status_code == 200, resp.text
    assert resp.json()["subject"] == "org:a%41"
    other = await client.get("/admin/limits/org/aA", headers=AUTH)
    assert other.status_code == 200 and other.json()["limit"] is None

    resp = await client.post("/admin/chains/li%2573t", headers=AUTH, json={})
    err = assert_openai_error(resp, 400)
    assert "li%73t" in err["message"]


@pytest.mark.nats
async def test_with_the_actors_down_a_client_is_told_to_retry_not_a_bus_subject(
    nats_url: str, tmp_path: Path
) -> None:
    # Auth on (auth: required): the first thing asked of the actors is the key lookup.
    cfg = config(model("m", {"kind": "echo"}), admin_key=ADMIN, auth="required")
    ingress = await start_gateway(cfg, nats_url, "ingress", data_dir=tmp_path)
    try:
        client = ingress.openai(api_key="llmgw-someone")
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=HI)
        plain = await ingress.http().post(CHAT, json=chat("m"), headers=AUTH)
        admin = await ingress.http().post("/admin/config/show", headers=AUTH)
    finally:
        await ingress.stop()

    assert caught.value.status_code == 503
    for resp in (caught.value.response, plain, admin):
        err = assert_openai_error(resp, 503)
        assert "llmgw." not in err["message"] and "responders" not in err["message"]
        assert "retry" in err["message"].lower()
        assert int(resp.headers["retry-after"]) >= 1


KEY = {"role": "free", "org": "o", "user": "u"}


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"rpm": 5}, "rpm", "PUT /admin/limits/key/"),
        ({"budget": "10/month"}, "budget", "PUT /admin/limits/key/"),
        ({"colour": "red"}, "colour", "not an argument of create"),
        ({"expires_in": "1h", "expires_at": 4102444800}, "expires_at", "one of"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at", "would be expired already"),
        ({"expires_at": 1}, "expires_at", "would be expired already"),
        # The message was Python's: "offset must be a timedelta strictly between ...".
        ({"expires_at": "2030-01-01T00:00:00+99:00"}, "expires_at", "not an ISO 8601 time"),
        ({"name": "ci\nAUDIT ok: key revoked"}, "name", "control characters"),
        ({"name": "x" * 10_000}, "name", "at most 256 characters"),
        ({"org": "acme\x1b[2J"}, "org", "control characters"),
        ({"user": "eve\u202egnp.exe"}, "user", "control characters"),
    ],
    ids=[
        "a-limit",
        "a-budget",
        "unknown",
        "both-expiries",
        # A key made unusable: every request with it got 401 expired.
        "already-expired",
        "expired-at-second-1",
        "an-offset-past-a-day",
        # Each was a 201: the name came back whole in every list, log line and event after.
        "a-forged-log-line",
        "ten-thousand-chars",
        "an-escape-sequence",
        "a-bidi-override",
    ],
)
async def test_a_key_created_with_what_create_does_not_take_is_400_and_no_key(
    routed_gw: RunningGateway, extra: dict[str, Any], param: str, says: str
) -> None:
    # Each was a 201: a limit silently dropped (the key unlimited, its creator thinking
    # otherwise), expires_in silently beating expires_at.
    http = routed_gw.http()

    resp = await http.post("/admin/keys", json={**KEY, **extra}, headers=AUTH)
    listed = (await http.get("/admin/keys", headers=AUTH)).json()["data"]

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param and says in err["message"], err
    assert str(extra[param]) not in err["message"]  # no value is quoted back
    assert listed == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/admin/api_keys/create", {**KEY, "c" * 100_000: 1}),
        ("/admin/steering/set_guardrails", {"g" * 100_000: 1}),
        ("/admin/routewise/set_settings", {"settings": {"s" * 100_000: 1}}),
    ],
    ids=["unknown-argument", "unknown-guardrail", "unknown-routewise-setting"],
)
async def test_a_refusal_quoting_a_huge_name_is_cut_in_the_answer(
    routed_gw: RunningGateway, path: str, body: dict[str, Any]
) -> None:
    """Each refusal quoted the whole 100,000-character name back, and the same message went
    whole into the audit log line and the ``admin`` event."""
    resp = await routed_gw.http().post(path, json=body, headers=AUTH)

    err = assert_openai_error(resp, 400, "invalid_request")
    assert len(err["message"]) <= 520 and len(err["param"] or "") <= 520, err


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("PUT", "/admin/limits/org/acme", {"rpm": 5, "budgt": "10/month"}, "budgt"),
        ("POST", "/admin/limits/set", {"subject": "org:acme", "rpm": 5, "soft": 0.5}, "soft"),
        ("PUT", "/admin/limits/org/acme", {"subject": "org:other", "rpm": 7}, "subject"),
        ("POST", "/admin/provider-keys", {"key": "sk-pk-0123", "min-role": "pro"}, "min-role"),
        # Each was kept and limited no key: no key has role "Pro", or a user with no name.
        ("PUT", "/admin/limits/role/Pro", {"rpm": 1}, "subject"),
        ("POST", "/admin/limits/set", {"subject": "user:acme/", "rpm": 1}, "subject"),
        ("POST", "/admin/limits/set", {"subject": "user:/bob", "rpm": 1}, "subject"),
        # 200 with the budget of 'budget': the other one dropped without a word.
        ("PUT", "/admin/limits/org/acme", {"budget": "10/month", "budget_usd": 3}, "budget_usd"),
    ],
    ids=[
        "a-misspelt-budget",
        "a-misspelt-soft-fraction",
        "another-subject",
        "a-misspelt-role",
        "a-role-no-key-has",
        "a-user-without-a-name",
        "a-user-without-an-org",
        "two-budgets",
    ],
)
async def test_a_limit_or_provider_key_that_would_not_apply_as_meant_is_400_and_unchanged(
    routed_gw: RunningGateway,
    fake_upstream: FakeUpstream,
    method: str,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    """Each was a 200: the org's limit set without its budget (``budgt`` dropped), the limit
    of ``org:other`` set through the path of ``org:acme``, a key meant for ``pro`` callers
    added for everyone (``min-role`` dropped)."""
    http = routed_gw.http()
    if path == "/admin/provider-keys":
        body = {**body, "endpoint": eid("m", fake_upstream)}

    resp = await http.request(method, path, json=body, headers=AUTH)
    limits = (await http.get("/admin/limits", headers=AUTH)).json()["limits"]
    keys = (await http.get("/admin/provider-keys", headers=AUTH)).json()["database"]

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param, err
    assert "sk-pk-0123" not in err["message"]
    assert (limits, keys) == ({}, [])


_EXPLAINED = {"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("PUT", "/admin/routing/weights/m/{endpoint}", {"weight": 2, "reason": "x"}, "reason"),
        ("PUT", "/admin/limits/org/acme", {"rpm": 5, "kind": "user"}, "kind"),
        ("POST", "/admin/provider-keys/k-0123/min-role", {"min_role": "pro", "id": "k-9"}, "id"),
        (
            "POST",
            "/admin/provider-keys/min-role-env",
            {"credential_id": "k-0123", "min_role": "pro", "tier": "pro"},
            "tier",
        ),
        ("POST", "/admin/routing/explain", {**_EXPLAINED, "header": {"x-user": "u"}}, "header"),
        ("PATCH", "/admin/routewise/model-settings/alpha?model_id=m", {"value": 1, "v": 2}, "v"),
    ],
    ids=[
        "weight-with-a-reason",
        "limit-with-a-kind-the-path-overrode",
        "min-role-with-an-id-the-path-overrode",
        "reservation-with-a-tier",
        "explain-with-a-misspelt-headers",
        "routewise-setting-with-an-extra",
    ],
)
async def test_a_dedicated_admin_route_given_a_body_field_it_does_not_take_is_400_naming_it(
    routed_gw: RunningGateway,
    fake_upstream: FakeUpstream,
    method: str,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    """Each was answered as if the field were not there (200): the weight set, the limit of
    ``org:acme`` set though the body said ``user``, the caller explained without the headers
    meant for it. The bus admin areas refuse an argument their verb does not take; so do the
    dedicated routes."""
    http = routed_gw.http()
    path = path.format(endpoint=eid("m", fake_upstream))

    resp = await http.request(method, path, json=body, headers=AUTH)
    weights = (await http.post("/admin/routing/weights", json={}, headers=AUTH)).json()
    limits = (await http.get("/admin/limits", headers=AUTH)).json()["limits"]

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param and f"takes no field '{param}'" in err["message"], err
    assert [r["overridden"] for m in weights["models"] for r in m["routes"]] == [False]
    assert limits == {}


async def test_a_reservation_given_both_a_key_and_a_credential_id_is_400_and_keeps_none(
    routed_gw: RunningGateway,
) -> None:
    """The key's id silently replaced the ``credential_id`` given beside it."""
    http = routed_gw.http()
    body = {"key": "sk-env-0123", "credential_id": "k-0123", "min_role": "pro"}

    resp = await http.post("/admin/provider-keys/min-role-env", json=body, headers=AUTH)
    listed = (await http.get("/admin/provider-keys", headers=AUTH)).json()

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == "key" and "one of 'key' and 'credential_id'" in err["message"]
    assert "sk-env-0123" not in resp.text
    assert listed.get("reservations", []) == []


@pytest.mark.parametrize(
    "key",
    ["sk-env\x00-0123", "sk-env-01\r\nx-forged: 1", "sk-" + "e" * 20_000, "", 7],
    ids=["a-nul", "a-line-break", "twenty-thousand-chars", "empty", "not-a-string"],
)
async def test_a_reservation_of_a_key_that_adding_it_refuses_is_400_and_keeps_none(
    routed_gw: RunningGateway, key: Any
) -> None:
    """Each was reserved (200): the key is hashed on the ingress, where the owner's checks of
    a key added never saw it."""
    http = routed_gw.http()
    body = {"key": key, "min_role": "pro"}

    resp = await http.post("/admin/provider-keys/min-role-env", json=body, headers=AUTH)
    listed = (await http.get("/admin/provider-keys", headers=AUTH)).json()

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == "key", err
    assert listed.get("reservations", []) == []


@pytest.mark.parametrize(
    ("verb", "body", "param"),
    [
        ("chains/create", {"name": "team", "models": ["m"], "orgg": "acme"}, "orgg"),
        ("steering/set_profile", {"profile": "custom", "weight": [0.2, 0.8, 0]}, "weight"),
        ("routing/set_weight", {"model": "m", "endpoint": "e", "weight": 0, "wieght": 5}, "wieght"),
        # Reads too: every row answered for a filter dropped, a report grouped by model.
        ("log/query", {"modle": "m", "limit": 5}, "modle"),
        ("spend/report", {"groupby": "org"}, "groupby"),
    ],
    ids=[
        "a-chain-for-everyone",
        "custom-with-no-weights",
        "a-misspelt-weight",
        "a-misspelt-filter",
        "a-misspelt-grouping",
    ],
)
async def test_an_admin_verb_given_an_argument_it_does_not_take_is_400(
    routed_gw: RunningGateway,
    fake_upstream: FakeUpstream,
    verb: str,
    body: dict[str, Any],
    param: str,
) -> None:
    """A chain meant for one organisation was made for every caller (``orgg`` dropped)."""
    http = routed_gw.http()
    if "endpoint" in body:
        body = {**body, "endpoint": eid("m", fake_upstream)}

    resp = await http.post(f"/admin/{verb}", json=body, headers=AUTH)
    chains = (await http.post("/admin/chains/list", json={}, headers=AUTH)).json()["chains"]
    weights = (await http.post("/admin/routing/weights", json={}, headers=AUTH)).json()

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param, err
    assert chains == []
    assert [r["overridden"] for m in weights["models"] for r in m["routes"]] == [False]


@pytest.mark.parametrize(
    ("verb", "body", "param"),
    [
        ("config/reload", {"path": "/etc/other.yaml"}, "path"),
        ("api_keys/revoke", {"id": "k1", "ids": ["k2"]}, "ids"),
        ("routewise/set_settings", {"setings": {"alpha": 0.5}}, "setings"),
        ("routewise/model_settings", {"model_id": "m", "model": "x"}, "model"),
    ],
    ids=["reload-from-another-file", "revoke-many", "a-misspelt-settings", "two-models"],
)
async def test_the_other_areas_refuse_an_argument_their_verb_does_not_take(
    routed_gw: RunningGateway, verb: str, body: dict[str, Any], param: str
) -> None:
    """A reload "from another file" reloaded the gateway's own, a revoke of several keys
    revoked one: each argument dropped read as applied."""
    resp = await routed_gw.http().post(f"/admin/{verb}", json=body, headers=AUTH)

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == param, err


async def test_a_get_of_an_admin_command_that_changes_state_is_refused_and_changes_nothing(
    routed_gw: RunningGateway,
) -> None:
    """``GET /admin/api_keys/create?org=x&user=y&role=admin`` made an admin key, and ``GET
    /admin/limits/clear?subject=...`` cleared a limit: a GET a proxy or client may repeat."""
    http = routed_gw.http()
    put = await http.put("/admin/limits/org/acme", json={"rpm": 5}, headers=AUTH)
    assert put.status_code == 200, put.text

    made = await http.get(
        "/admin/api_keys/create", params={"org": "x", "user": "y", "role": "admin"}, headers=AUTH
    )
    cleared = await http.get("/admin/limits/clear", params={"subject": "org:acme"}, headers=AUTH)
    listed = await http.get("/admin/chains/list", headers=AUTH)  # a read: still a GET

    for resp in (made, cleared):
        err = assert_openai_error(resp, 400, "invalid_request")
        assert "send it with POST" in err["message"], err
    assert listed.status_code == 200, listed.text
    assert (await http.get("/admin/keys", headers=AUTH)).json()["data"] == []
    limits = (await http.get("/admin/limits", headers=AUTH)).json()["limits"]
    assert limits == {"org:acme": {"rpm": 5}}


async def test_a_provider_key_added_twice_to_one_route_is_refused_the_second_time(
    routed_gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    """A second add (a retry) made a second row of the same credential: deleting one, as the
    operator meant to remove the key, left it served from the other."""
    http = routed_gw.http()
    body = {"key": "sk-twice-0123", "endpoint": eid("m", fake_upstream)}

    first = await http.post("/admin/provider-keys", json=body, headers=AUTH)
    second = await http.post("/admin/provider-keys", json=body, headers=AUTH)
    rows = (await http.get("/admin/provider-keys", headers=AUTH)).json()["database"]

    assert first.status_code == 201, first.text
    err = assert_openai_error(second, 400, "invalid_request")
    assert err["param"] == "key" and first.json()["id"] in err["message"], err
    assert "sk-twice-0123" not in err["message"]
    assert [r["id"] for r in rows] == [first.json()["id"]]


async def test_a_chain_name_no_chain_can_have_is_quoted_clipped_and_a_rule_name_checked(
    routed_gw: RunningGateway,
) -> None:
    http = routed_gw.http()
    rules = "/api/fallback/routing-rules"
    bad_rule = {"name": "r\r\nx", "when": {"metadata.job": "batch"}, "route": "auto:cheapest"}

    long_chain = await http.post(
        "/admin/chains/create", json={"name": "Z" * 200, "models": []}, headers=AUTH
    )
    rule = await http.put(rules, json={"rules": [bad_rule]}, headers=AUTH)
    after = await http.get(rules, headers=AUTH)

    message = assert_openai_error(long_chain, 400, "invalid_request")["message"]
    assert "(200 characters)" in message and len(message) < 300, message
    assert "control characters" in assert_openai_error(rule, 400, "invalid_request")["message"]
    assert after.json()["rules"] == []
