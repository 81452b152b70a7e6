"""The admin API's refusals through the real server: a method a limit subject has no verb
for, JSON nested too deeply for explain and the routing rules, an unknown admin area (404,
not "no responders"), and what a client reads while the actors are down (no bus subject)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import CHAT, HI, assert_openai_error, chat, config, model
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

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


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_unknown_admin_area_is_404_without_retry_after(
    gw: RunningGateway, method: str
) -> None:
    resp = await gw.http().request(method, "/admin/nope/show", headers=AUTH)

    err = assert_openai_error(resp, 404)
    assert "'nope'" in err["message"]
    assert "retry-after" not in resp.headers


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
