"""The routing rule set through the real server: ``GET``/``PUT /api/fallback/routing-rules``
(admin only; a put replaces the whole set; an invalid one is a 400 naming the path of its
first problem and changes nothing), ``validate`` on the admin API, ``llmgw admin rules``, a
change seen by a second ingress at once, kept across a restart, and a corrupt stored set
read as disabled (``/health/deep`` and an event say so; requests still served). Runs on
``inproc://`` and on NATS."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from schemas import RulesState, subjects
from schemas.rule_cost import NODE_UNITS
from schemas.rules import (
    MAX_CLAUSES,
    MAX_DEPTH,
    MAX_REGEX_CHARS,
    MAX_REGEX_PROGRAM,
    MAX_RULE_SET_UNITS,
    MAX_RULES,
    Rule,
    StoredRules,
)
from tests.e2e.conftest import CHAT, assert_openai_error, chat, config, model, route, watch
from tests.e2e.test_cli_operator import llmgw
from tests.fixtures.rule_sets import KINDS, worst_set
from tests.fixtures.rule_sets import labels as worst_labels

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

ADMIN = "adm-rules"
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
PATH = "/api/fallback/routing-rules"
TOOLS = {"name": "tools", "when": {"params.has_tools": True}, "route": "auto:coding"}
LONG = {
    "name": "long",
    "when": {"params.prompt_tokens": {"$gt": 50000}},
    "route": "auto:long-context",
}
BATCH = {
    "name": "batch",
    "when": {"$or": [{"metadata.job": "batch"}, {"metadata.priority": {"$lt": 1}}]},
    "route": "auto:cheapest",
}


def _config(up: FakeUpstream) -> dict[str, Any]:
    return config(model("m", route(up)), admin_key=ADMIN)


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m`` and an admin key."""
    return await gateway_factory(_config(fake_upstream))


async def _put(gw: RunningGateway, body: Any) -> httpx.Response:
    return await gw.http().put(PATH, json=body, headers=ADMIN_AUTH)


async def _get(gw: RunningGateway) -> dict[str, Any]:
    resp = await gw.http().get(PATH, headers=ADMIN_AUTH)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def _health_rules(gw: RunningGateway) -> dict[str, Any]:
    resp = await gw.http().get("/health/deep", headers=ADMIN_AUTH)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["rules"])


async def test_a_put_replaces_the_whole_set_and_a_get_reads_it(gw: RunningGateway) -> None:
    empty = await _get(gw)
    first = await _put(gw, {"rules": [TOOLS, LONG]})
    second = await _put(gw, {"rules": [BATCH]})
    got = await _get(gw)
    health = await _health_rules(gw)

    assert (empty["rules"], empty["status"], empty["version"]) == ([], "ok", 0)
    assert first.status_code == 200, first.text
    assert [r["name"] for r in first.json()["rules"]] == ["tools", "long"]
    assert second.status_code == 200, second.text
    assert got["rules"] == [BATCH] and got["version"] == 2 and got["status"] == "ok"
    assert health == {"status": "ok", "rules": 1, "version": 2}


def _nest(levels: int) -> dict[str, Any]:
    cond: dict[str, Any] = {"params.stream": True}
    for _ in range(levels - 1):
        cond = {"$and": [cond]}
    return cond


def _rule(when: Any, name: str = "r", route_to: str = "auto:a") -> dict[str, Any]:
    return {"name": name, "when": when, "route": route_to}


def _regex_rules(pattern: Callable[[int], str]) -> dict[str, Any]:
    """100 rules of 64 distinct ``$regex`` comparisons: the issue's set that stalled a PUT."""
    return {
        "rules": [
            _rule(
                {"$or": [{f"metadata.k{j}": {"$regex": pattern(i * 64 + j)}} for j in range(64)]},
                f"r{i}",
            )
            for i in range(MAX_RULES)
        ]
    }


INVALID: dict[str, tuple[Any, str]] = {
    "regex_backreference": (
        {
            "rules": [
                TOOLS,
                LONG,
                BATCH,
                _rule({"$and": [{"params.stream": True}, {"metadata.team": {"$regex": "(a)\\1"}}]}),
            ]
        },
        "rules[3].when.$and[1].metadata.team.$regex",
    ),
    "regex_too_long": (
        {"rules": [_rule({"metadata.t": {"$regex": "a" * (MAX_REGEX_CHARS + 1)}})]},
        "rules[0].when.metadata.t.$regex",
    ),
    "too_deep": (
        {"rules": [_rule(_nest(MAX_DEPTH + 1))]},
        "rules[0].when" + ".$and[0]" * MAX_DEPTH,
    ),
    "too_many_clauses": (
        {"rules": [_rule({f"metadata.k{i}": 1 for i in range(MAX_CLAUSES + 1)})]},
        f"rules[0].when.metadata.k{MAX_CLAUSES}",
    ),
    "too_many_rules": ({"rules": [_rule({}, f"r{i}") for i in range(MAX_RULES + 1)]}, "rules"),
    "closed_namespace": ({"rules": [_rule({"params.org": "acme"})]}, "rules[0].when.params.org"),
    "unknown_operator": (
        {"rules": [_rule({"params.role": {"$where": "x"}})]},
        "rules[0].when.params.role.$where",
    ),
    "not_a_route": ({"rules": [_rule({}, route_to="gpt-4o")]}, "rules[0].route"),
    "duplicate_name": ({"rules": [TOOLS, {**LONG, "name": "tools"}]}, "rules[1].name"),
    "not_a_set": ({"rules": "all"}, "rules"),
    "no_rules_at_all": ({}, "rules"),  # {} sent in error emptied the set; clearing it says []
    "regex_program_too_large": (
        {"rules": [_rule({"metadata.t": {"$regex": f"x{{{MAX_REGEX_PROGRAM}}}"}})]},
        "rules[0].when.metadata.t.$regex",
    ),
    # Refused at its first pattern (too large a program), not after compiling 6,400 of them.
    "the_issue_set": (
        _regex_rules(lambda n: rf"\PN{{90}}\d{n}"),
        "rules[0].when.$or[0].metadata.k0.$regex",
    ),
    # Small patterns, but past the set's matching budget at the 37th.
    "over_the_budget": (
        _regex_rules(lambda n: f"^q{n:04d}z"),
        "rules[0].when.$or[36].metadata.k36.$regex",
    ),
}


@pytest.mark.parametrize(("body", "path"), INVALID.values(), ids=INVALID.keys())
async def test_an_invalid_put_is_a_400_naming_the_path_and_changes_nothing(
    gw: RunningGateway, body: Any, path: str
) -> None:
    assert (await _put(gw, {"rules": [TOOLS]})).status_code == 200

    resp = await _put(gw, body)
    after = await _get(gw)

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == path
    assert err["message"].startswith(f"{path}: ")
    assert after["rules"] == [TOOLS] and after["version"] == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_the_worst_set_of_each_kind_is_stored_and_auto_is_served_with_the_longest_labels(
    gw: RunningGateway, kind: str
) -> None:
    worst = worst_set(kind)  # fills the budget with distinct parts of one kind
    labels = worst_labels(random.Random(22))
    used = {k: labels[k] for k in ("k0", "k1", "k2", "k3")}

    put = await _put(gw, {"rules": [msgspec.to_builtins(r) for r in worst]})
    served = await gw.http().post(
        CHAT, json=chat("auto"), headers={"x-llmgw-metadata": json.dumps(used)}
    )

    assert put.status_code == 200, put.text
    assert served.status_code == 200, served.text  # no rule matches: the active chain serves
    assert served.json()["model"] == "m"


async def test_one_part_past_the_budget_is_a_400_naming_it_and_the_budget(
    gw: RunningGateway,
) -> None:
    full = [msgspec.to_builtins(r) for r in worst_set("regex_calls_no_match")]
    more = _rule({"metadata.k0": {"$regex": "^more$"}}, "more")
    path = f"rules[{len(full)}].when.metadata.k0.$regex"

    at_budget = await _put(gw, {"rules": full})
    past = await _put(gw, {"rules": [*full, more]})

    assert at_budget.status_code == 200, at_budget.text
    err = assert_openai_error(past, 400, "invalid_request")
    assert err["param"] == path
    assert err["message"].startswith(f"{path}: ")
    assert f"budget of {MAX_RULE_SET_UNITS:,} units" in err["message"]
    assert (await _get(gw))["version"] == 1  # the set at the budget is still the one stored


async def test_validate_checks_a_set_without_storing_it(gw: RunningGateway) -> None:
    admin = gw.http(headers=ADMIN_AUTH)
    good = await admin.post("/admin/rules/validate", json={"rules": [TOOLS, LONG]})
    bad = await admin.post(
        "/admin/rules/validate", json={"rules": [_rule({"metadata.x": {"$regex": "(?<=a)b"}})]}
    )

    assert good.status_code == 200 and good.json() == {"valid": True, "rules": 2}
    assert_openai_error(bad, 400, "invalid_request")
    assert bad.json()["error"]["param"] == "rules[0].when.metadata.x.$regex"
    assert (await _get(gw))["rules"] == []


async def test_an_integer_past_int64_is_a_400_naming_it_and_changes_nothing(
    gw: RunningGateway,
) -> None:
    """The set was stored (and kept across a restart) while ``/admin/rules/validate``
    refused the same set: no bus codec takes an integer past int64."""
    assert (await _put(gw, {"rules": [TOOLS]})).status_code == 200
    huge = _rule({"params.prompt_tokens": {"$gt": 10**30}})

    resp = await _put(gw, {"rules": [huge]})

    err = assert_openai_error(resp, 400, "invalid_request")
    assert err["param"] == "rules[0].when.params.prompt_tokens.$gt", err
    assert (await _get(gw))["rules"] == [TOOLS]


async def test_the_rules_admin_needs_the_admin_key(gw: RunningGateway) -> None:
    admin = gw.http(headers=ADMIN_AUTH)
    made = await admin.post("/admin/keys", json={"org": "o", "user": "u", "role": "internal"})
    assert made.status_code == 201, made.text
    keyed = {"authorization": f"Bearer {made.json()['key']}"}
    anonymous = await gw.http().get(PATH)
    wrong = await gw.http().put(PATH, json={"rules": []}, headers={"authorization": "Bearer nope"})
    not_admin = await gw.http().put(PATH, json={"rules": []}, headers=keyed)
    events = await gw.http().get("/events", headers=keyed)

    assert_openai_error(anonymous, 401, "unauthorized")
    assert_openai_error(wrong, 401, "unauthorized")
    # A key the gateway knows, of another role: forbidden, as on /admin/*, not unknown.
    assert_openai_error(not_admin, 403, "forbidden")
    assert_openai_error(events, 403, "forbidden")


async def test_a_change_reaches_a_second_ingress_at_once_and_survives_a_restart(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, bus_url: str
) -> None:
    cfg = _config(fake_upstream)
    gw = await gateway_factory(cfg)
    other = await gateway_factory(cfg, role="ingress") if bus_url.startswith("nats") else gw
    async with watch(other, subjects.RULES_STATE) as published:
        assert (await _put(gw, {"rules": [TOOLS, BATCH]})).status_code == 200
        await published.next(RulesState, lambda s: s.version == 1)
    seen = await _health_rules(other)
    for g in {id(gw): gw, id(other): other}.values():
        assert await g.stop() == 0

    again = await gateway_factory(cfg)

    assert seen == {"status": "ok", "rules": 2, "version": 1}
    assert (await _get(again))["rules"] == [TOOLS, BATCH]
    assert await _health_rules(again) == {"status": "ok", "rules": 2, "version": 1}


CORRUPT = b'{"rules": [{"name": 1'  # a stored set that no longer reads


def _store_snapshot(gw: RunningGateway, data: bytes) -> None:
    """Write the RulesActor's snapshot behind a stopped gateway's back."""
    with sqlite3.connect(gw.config.database.path) as db:
        db.execute(
            "INSERT INTO actor_snapshots (name, data, updated) VALUES ('rules', ?, 0) "
            "ON CONFLICT(name) DO UPDATE SET data = excluded.data",
            (data,),
        )


async def _restarted_over(
    gateway_factory: GatewayFactory, cfg: dict[str, Any], snapshot: bytes
) -> RunningGateway:
    """A gateway that stored a valid set, stopped, had its snapshot replaced, and started."""
    gw = await gateway_factory(cfg)
    assert (await _put(gw, {"rules": [TOOLS]})).status_code == 200
    assert await gw.stop() == 0
    await asyncio.to_thread(_store_snapshot, gw, snapshot)
    return await gateway_factory(cfg)


async def test_a_corrupt_stored_set_reads_as_disabled_and_requests_are_still_served(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await _restarted_over(gateway_factory, _config(fake_upstream), CORRUPT)
    health = await _health_rules(gw)
    got = await _get(gw)
    served = await gw.http().post(CHAT, json=chat("m"))
    repaired = await _put(gw, {"rules": [LONG]})

    assert health["status"] == "disabled" and health["rules"] == 0
    assert "does not read" in health["reason"]
    assert got["status"] == "disabled" and got["rules"] == []
    assert served.status_code == 200
    assert repaired.status_code == 200 and repaired.json()["status"] == "ok"
    assert await _health_rules(gw) == {"status": "ok", "rules": 1, "version": 1}


def _past_the_budget() -> bytes:
    """A set each part of which reads, stored as an earlier, larger budget let it be."""
    empties: dict[str, Any] = {"$and": [{}] * (MAX_RULE_SET_UNITS // NODE_UNITS + 1)}
    past = StoredRules(rules=(Rule(name="old", when=empties, route="auto:a"),), version=3)
    return msgspec.json.encode(past)


async def test_a_stored_set_past_a_lowered_budget_is_disabled_and_auto_is_still_served(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await _restarted_over(gateway_factory, _config(fake_upstream), _past_the_budget())
    health = await _health_rules(gw)
    served = await gw.http().post(CHAT, json=chat("auto"))

    assert health["status"] == "disabled" and health["rules"] == 0
    assert f"budget of {MAX_RULE_SET_UNITS:,} units" in health["reason"]
    assert served.status_code == 200, served.text
    assert served.json()["model"] == "m"  # no rules: the active chain serves


async def test_a_set_corrupted_while_running_is_disabled_on_reload_with_an_event(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw = await gateway_factory(_config(fake_upstream), config_path=tmp_path / "gw.yaml")
    assert (await _put(gw, {"rules": [TOOLS]})).status_code == 200
    await asyncio.to_thread(_store_snapshot, gw, CORRUPT)

    async with watch(gw, subjects.event("rules")) as events:
        reload = await gw.http(headers=ADMIN_AUTH).post("/admin/config/reload")
        assert reload.status_code == 200, reload.text
        event = await events.next(RulesState)
    health = await _health_rules(gw)
    served = await gw.http().post(CHAT, json=chat("m"))

    assert event.status == "disabled" and "does not read" in event.reason
    assert health["status"] == "disabled"
    assert served.status_code == 200


async def test_llmgw_admin_rules_put_get_validate_from_a_file(
    gw: RunningGateway, tmp_path: Path
) -> None:
    good, bad = tmp_path / "rules.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"rules": [TOOLS, LONG]}))
    bad.write_text(json.dumps({"rules": [_rule({"params.nope": 1})]}))
    target = ["--url", gw.url, "--admin-key", ADMIN]

    put = await asyncio.to_thread(
        llmgw, tmp_path, "admin", "rules", "put", "--file", str(good), *target
    )
    got = await asyncio.to_thread(llmgw, tmp_path, "admin", "rules", "get", *target)
    refused = await asyncio.to_thread(
        llmgw, tmp_path, "admin", "rules", "validate", "--file", str(bad), *target
    )

    assert put.returncode == 0, put.stderr
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["rules"] == [TOOLS, LONG]
    assert refused.returncode == 1
    assert "rules[0].when.params.nope" in refused.stderr
