"""Routing rules steering ``model: "auto"`` through the real server, with the official SDKs:
each operator and ``$and``/``$or`` nesting over ``params.*`` and ``metadata.*`` (the
``x-llmgw-metadata`` header), first match wins, explicit targets beat rules, a rule naming
another organisation's chain falls through, the regex bomb answered like any request, the
rule named in the ``decision`` event and in explain, and a rule put through one ingress
routing on another at once. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from schemas import RouteDecided, RulesState, subjects
from schemas.rules import MAX_LABEL_BYTES
from tests.e2e.conftest import HI, config, model, route, watch
from tests.e2e.keys_support import ADMIN, create_keys, keys_config

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
HEADER = "x-llmgw-metadata"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
RULES: list[dict[str, Any]] = [
    {"name": "tools", "when": {"params.has_tools": True}, "route": "auto:coding"},
    {"name": "acme", "when": {"metadata.team": "acme"}, "route": "auto:acme-only"},
    {"name": "long", "when": {"params.prompt_tokens": {"$gte": 2000}}, "route": "auto:Coding"},
    {
        "name": "batch",
        "when": {
            "$or": [
                {"metadata.job": {"$in": ["batch", "nightly"]}},
                {"$and": [{"params.stream": True}, {"metadata.priority": {"$lte": 1}}]},
            ]
        },
        "route": "auto:thrifty",
    },
    {"name": "bomb", "when": {"metadata.label": {"$regex": "(a+)+$"}}, "route": "auto:coding"},
    {
        "name": "messages",
        "when": {
            "params.surface": "messages",
            "params.temperature": {"$lt": 0.5},
            "metadata.region": {"$nin": ["eu"]},
        },
        "route": "auto:thrifty",
    },
    {
        "name": "responses",
        "when": {
            "params.surface": {"$eq": "responses"},
            "metadata.tier": {"$ne": "gold"},
            "params.message_count": {"$gt": 0},
        },
        "route": "auto:thrifty",
    },
    {"name": "axis", "when": {"metadata.want": "cheap"}, "route": "auto:cheapest"},
]


def _config(tmp_path: Path, a: Any, b: Any, c: Any) -> dict[str, Any]:
    """a: the smartest (what plain ``auto`` serves); b: the biggest free allowance (what
    ``auto:cheapest`` serves); chains coding=[b], thrifty=[c], acme-only=[c] (org acme)."""
    return keys_config(
        tmp_path,
        model("a", route(a), catalog={"tier": 3}),
        model("b", route(b), catalog={"tier": 2, "free_allowance": {"monthly_tokens": 10**9}}),
        model("c", route(c), catalog={"tier": 1}),
        chains=[
            {"name": "coding", "models": ["b"]},
            {"name": "thrifty", "models": ["c"]},
            {"name": "acme-only", "org": "acme", "models": ["c"]},
        ],
        steering={"exploration": 0},
    )


@pytest.fixture
async def setup(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path
) -> tuple[RunningGateway, str, str]:
    """(gateway with the rules put, an acme caller's key, another organisation's key)."""
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    (acme,), (other,) = await asyncio.gather(
        create_keys(tmp_path, "free", org="acme"), create_keys(tmp_path, "free", org="other")
    )
    gw = await gateway_factory(_config(tmp_path, a, b, c))
    put = await gw.http().put(
        "/api/fallback/routing-rules", json={"rules": RULES}, headers=ADMIN_AUTH
    )
    assert put.status_code == 200, put.text
    return gw, acme, other


def _labels(**labels: Any) -> dict[str, str]:
    return {HEADER: json.dumps(labels)} if labels else {}


async def _chat(
    gw: RunningGateway,
    key: str,
    name: str = "auto",
    *,
    labels: dict[str, Any] | None = None,
    **kw: Any,
) -> str:
    answer = await gw.openai(key).chat.completions.create(
        model=name, messages=kw.pop("messages", HI), extra_headers=_labels(**(labels or {})), **kw
    )
    return str(answer.model)


async def test_rules_route_auto_by_params_and_labels_on_chat(
    setup: tuple[RunningGateway, str, str],
) -> None:
    gw, acme, _ = setup
    long_prompt = [{"role": "user", "content": "x" * 9000}]

    served = {
        "plain": await _chat(gw, acme),
        "tools": await _chat(gw, acme, tools=[TOOL]),
        "tools_any_case": await _chat(gw, acme, "AUTO", tools=[TOOL]),
        "long": await _chat(gw, acme, messages=long_prompt),
        "job_in": await _chat(gw, acme, labels={"job": "nightly"}),
        "job_not_in": await _chat(gw, acme, labels={"job": "daily"}),
        "first_match": await _chat(gw, acme, labels={"job": "batch"}, tools=[TOOL]),
        "regex": await _chat(gw, acme, labels={"label": "aaaa"}),
        "regex_bomb": await _chat(gw, acme, labels={"label": "a" * (MAX_LABEL_BYTES - 1) + "!"}),
        "mismatched_type": await _chat(gw, acme, labels={"job": 1, "priority": "0"}),
        "axis": await _chat(gw, acme, labels={"want": "cheap"}),
    }
    stream = await gw.openai(acme).chat.completions.create(
        model="auto", messages=HI, stream=True, extra_headers=_labels(priority=0)
    )
    streamed = {chunk.model async for chunk in stream}
    stream_low_priority_unstreamed = await _chat(gw, acme, labels={"priority": 0})

    assert served == {
        "plain": "a",
        "tools": "b",
        "tools_any_case": "b",
        "long": "b",
        "job_in": "c",
        "job_not_in": "a",
        "first_match": "b",
        "regex": "b",
        "regex_bomb": "a",
        "mismatched_type": "a",
        "axis": "b",
    }
    assert streamed == {"c"}  # $and of stream and $lte
    assert stream_low_priority_unstreamed == "a"


async def test_explicit_targets_always_beat_rules(setup: tuple[RunningGateway, str, str]) -> None:
    gw, acme, _ = setup

    served = {
        name: await _chat(gw, acme, name, tools=[TOOL])
        for name in ("a", "auto:smartest", "auto:thrifty", "auto:acme-only")
    }

    assert served == {"a": "a", "auto:smartest": "a", "auto:thrifty": "c", "auto:acme-only": "c"}


async def test_a_rule_naming_another_organisations_chain_falls_through(
    setup: tuple[RunningGateway, str, str],
) -> None:
    gw, acme, other = setup

    mine = await _chat(gw, acme, labels={"team": "acme"})
    theirs = await _chat(gw, other, labels={"team": "acme"})
    theirs_next_rule = await _chat(gw, other, labels={"team": "acme", "job": "batch"})

    assert (mine, theirs, theirs_next_rule) == ("c", "a", "c")


async def test_rules_on_the_messages_and_responses_surfaces(
    setup: tuple[RunningGateway, str, str],
) -> None:
    gw, acme, _ = setup

    async def messages(temperature: float, **labels: Any) -> str:
        answer = await gw.anthropic(acme).messages.create(
            model="auto",
            max_tokens=16,
            extra_body={"temperature": temperature},
            extra_headers=_labels(**labels),
            messages=[{"role": "user", "content": "hi"}],
        )
        return str(answer.model)

    async def responses(**labels: Any) -> str:
        answer = await gw.openai(acme).responses.create(
            model="auto", input="hi", extra_headers=_labels(**labels)
        )
        return str(answer.model)

    served = {
        "cool": await messages(0.2),
        "hot": await messages(0.9),
        "eu": await messages(0.2, region="eu"),
        "us": await messages(0.2, region="us"),
        "no_tier": await responses(),
        "silver": await responses(tier="silver"),
        "gold": await responses(tier="gold"),
    }

    assert served == {
        "cool": "c",
        "hot": "a",
        "eu": "a",
        "us": "c",
        "no_tier": "c",
        "silver": "c",
        "gold": "a",
    }


async def test_the_decision_event_names_the_rule(setup: tuple[RunningGateway, str, str]) -> None:
    gw, acme, _ = setup

    async with watch(gw, subjects.event("decision")) as decisions:
        await _chat(gw, acme, tools=[TOOL])
        ruled = await decisions.next(RouteDecided)
        await _chat(gw, acme)
        plain = await decisions.next(RouteDecided)

    assert (ruled.requested_model, ruled.rule, ruled.target, ruled.chain, ruled.model) == (
        "auto",
        "tools",
        "auto:coding",
        "coding",
        "b",
    )
    assert (plain.rule, plain.target, plain.model) == ("", "auto", "a")


async def _explain(
    gw: RunningGateway, key: str, body: dict[str, Any], **labels: Any
) -> dict[str, Any]:
    resp = await gw.http().post(
        "/admin/routing/explain",
        headers=ADMIN_AUTH,
        json={
            "path": "/v1/chat/completions",
            "body": body,
            "headers": {"authorization": f"Bearer {key}", **_labels(**labels)},
        },
    )
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_explain_shows_every_rule_with_the_failed_clause_and_agrees_with_live(
    setup: tuple[RunningGateway, str, str],
) -> None:
    gw, acme, other = setup
    body = {"model": "auto", "messages": HI}

    mine = await _explain(gw, acme, body, team="acme")
    theirs = await _explain(gw, other, body, team="acme")
    explicit = await _explain(gw, acme, {**body, "model": "auto:thrifty"}, team="acme")
    live = await _chat(gw, acme, labels={"team": "acme"})

    assert mine["target"]["chain"] == "acme-only" and mine["target"]["rule"] == "acme"
    assert mine["plan"]["model"] == live == "c"
    assert mine["rules"][:2] == [
        {
            "name": "tools",
            "route": "auto:coding",
            "matched": False,
            "failed": {"path": "rules[0].when.params.has_tools", "value": False},
        },
        {"name": "acme", "route": "auto:acme-only", "matched": True},
    ]
    assert mine["rules"][2]["failed"]["path"] == "rules[2].when.params.prompt_tokens.$gte"
    assert mine["rules"][3]["failed"] == {"path": "rules[3].when.$or"}
    assert mine["rules"][4]["failed"] == {
        "path": "rules[4].when.metadata.label.$regex",
        "missing": True,
    }
    assert [r["name"] for r in mine["rules"]] == [r["name"] for r in RULES]
    assert theirs["rules"][1]["skipped"]
    assert "rule" not in theirs["target"] and theirs["plan"]["model"] == "a"
    assert explicit["rules"] == [] and explicit["target"]["chain"] == "thrifty"


async def test_a_rule_put_through_one_ingress_routes_on_another_at_once(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    bus_url: str,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    (acme,) = await create_keys(tmp_path, "free", org="acme")
    cfg = _config(tmp_path, a, b, c)
    gw = await gateway_factory(cfg)
    other = await gateway_factory(cfg, role="ingress") if bus_url.startswith("nats") else gw
    before = await _chat(other, acme, tools=[TOOL])

    async with watch(other, subjects.RULES_STATE) as published:
        put = await gw.http().put(
            "/api/fallback/routing-rules", json={"rules": RULES[:1]}, headers=ADMIN_AUTH
        )
        assert put.status_code == 200, put.text
        await published.next(RulesState, lambda s: s.version == 1)
    after = await _chat(other, acme, tools=[TOOL])

    assert (before, after) == ("a", "b")


async def test_without_rules_auto_is_unchanged(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    a = await fake_upstreams("a")
    gw = await gateway_factory(config(model("a", route(a))))

    resp = await gw.http().post(
        "/v1/chat/completions", json={"model": "auto", "messages": HI, "tools": [TOOL]}
    )

    assert resp.status_code == 200 and resp.json()["model"] == "a"
