"""``POST /admin/routing/explain`` through the real server: it runs the live path's own
resolution, so its first model and first route are what the next live request gets; it
shows how the target resolved, each candidate's scores and multipliers, the excluded models
with their reasons, and the first model's plan; it calls no upstream, takes the described
caller's headers (organisation, role), and is for admins only. On ``inproc://`` and NATS."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import (
    CHAT,
    HALF_OPEN_SOON,
    HI,
    assert_openai_error,
    chat,
    circuit_events,
    config,
    eid,
    model,
    route,
)
from tests.e2e.keys_support import ADMIN, create_keys, keys_config
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

AUTH = {"authorization": f"Bearer {ADMIN}"}


async def _explain(
    gw: RunningGateway,
    body: dict[str, Any],
    path: str = CHAT,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    resp = await gw.http().post(
        "/admin/routing/explain",
        headers=AUTH,
        json={"path": path, "body": body, "headers": headers or {}},
    )
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def test_explain_agrees_with_the_live_decision_and_says_why(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    (acme_key,) = await create_keys(tmp_path, "free", org="acme")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("a", route(a), catalog={"tier": 3}, required_role="pro"),
            model("b", route(b), catalog={"tier": 2}),
            model("c", route(c)),
            model("off", route(c), catalog={"enabled": False}),
            chains=[{"name": "team", "org": "acme", "models": ["a", "off", "c", "b"]}],
            steering={"exploration": 0},
            routing={"affinity": {"enabled": False}, "key_pool": {}, "bench": {"failures": 50}},
        )
    )
    caller = {"authorization": f"Bearer {acme_key}"}
    requests_before = len(a.requests) + len(b.requests) + len(c.requests)

    balanced = await _explain(gw, {"model": "auto", "messages": HI}, headers=caller)
    chain = await _explain(
        gw,
        {"model": "AUTO:Team", "max_tokens": 5, "messages": HI},
        path="/v1/messages",
        headers=caller,
    )
    plain = await _explain(gw, {"model": "b", "input": "hi"}, path="/v1/responses", headers=caller)
    sent = len(a.requests) + len(b.requests) + len(c.requests)
    live = await gw.openai(acme_key).chat.completions.with_raw_response.create(
        model="auto", messages=HI
    )
    live_chain = await gw.anthropic(acme_key).messages.with_raw_response.create(
        model="auto:team", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )

    assert sent == requests_before  # explain calls no upstream
    assert balanced["target"] == {
        "kind": "auto",
        "name": "auto",
        "chain": None,
        "axis": None,
        "ordering": "balanced",
        "weights": [0.5, 0.25, 0.25],
        "affinity": False,
    }
    assert balanced["order"] == ["b", "c"]
    assert {"model": "a", "reason": "role"} in balanced["excluded"]
    assert {"model": "off", "reason": "disabled"} in balanced["excluded"]
    first = balanced["candidates"][1]  # a, the best scored, is excluded by role
    assert first["model"] == "b" and first["multipliers"] == {"allowance": 1.0, "rate_limit": 1.0}
    assert first["score"] == pytest.approx(0.5 * 0.5 + 0.25 * 0.5 + 0.25 * 0.5)
    assert balanced["plan"]["model"] == "b"
    assert balanced["plan"]["candidates"][0]["endpoint"] == eid("b", b)
    assert live.parse().model == "b" and live.headers["x-routed-via"] == eid("b", b)

    assert chain["target"]["chain"] == "team" and chain["target"]["ordering"] == "priority"
    assert chain["order"] == ["c", "b"]
    assert chain["excluded"] == [
        {"model": "off", "reason": "disabled"},
        {"model": "a", "reason": "role"},
    ]
    assert (await live_chain.parse()).model == "c"
    assert live_chain.headers["x-routed-via"] == chain["plan"]["candidates"][0]["endpoint"]

    assert plain["target"] == {"kind": "model", "model": "b"} and plain["order"] == []
    assert plain["plan"]["candidates"][0]["endpoint"] == eid("b", b)


async def test_explain_refuses_what_the_live_path_refuses_and_needs_an_admin(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    a = await fake_upstreams("a")
    (other_key,) = await create_keys(tmp_path, "free", org="other")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("a", route(a)),
            chains=[{"name": "team", "org": "acme", "models": ["a"]}],
        )
    )
    http = gw.http()

    foreign = await http.post(
        "/admin/routing/explain",
        headers=AUTH,
        json={
            "body": {"model": "auto:team", "messages": HI},
            "headers": {"authorization": f"Bearer {other_key}"},
        },
    )
    bad = await http.post("/admin/routing/explain", headers=AUTH, json={"body": "nope"})
    bad_tool = await http.post(
        "/admin/routing/explain",
        headers=AUTH,
        json={"path": "/v1/responses", "body": {"model": "a", "input": "hi", "tools": ["x"]}},
    )
    not_admin = await http.post(
        "/admin/routing/explain",
        json={"body": {"model": "a", "messages": HI}},
        headers={"authorization": f"Bearer {other_key}"},
    )
    odd_paths: list[object] = [{"a": 1}, [], 7]
    paths = [
        await http.post(
            "/admin/routing/explain", headers=AUTH, json={"path": path, "body": {"model": "a"}}
        )
        for path in odd_paths
    ]
    labels = {"x-llmgw-metadata": "{bad"}  # the live path refuses it whatever the model
    bad_labels = await http.post(
        "/admin/routing/explain",
        headers=AUTH,
        json={"body": {"model": "a", "messages": HI}, "headers": labels},
    )
    caller = {**labels, "authorization": f"Bearer {other_key}"}
    live = await http.post(CHAT, json={"model": "a", "messages": HI}, headers=caller)

    assert "'team'" in assert_openai_error(foreign, 400, "invalid_request")["message"]
    assert assert_openai_error(bad, 400, "invalid_request")["param"] == "body"
    assert assert_openai_error(bad_tool, 400, "invalid_request")["param"] == "tools[0]"
    assert not_admin.status_code in (401, 403)
    for refused in paths:
        assert assert_openai_error(refused, 400, "invalid_request")["param"] == "path"
    assert assert_openai_error(live, 400, "invalid_request")["param"] == "x-llmgw-metadata"
    refusal = assert_openai_error(bad_labels, 400, "invalid_request")
    assert refusal["param"] == "x-llmgw-metadata"
    assert len(a.requests) == 0


@pytest.mark.parametrize("label", ["\u65e5\u672c", "\u00e9\u00e9"], ids=["cjk", "accented"])
async def test_explain_takes_a_described_header_in_utf8_as_a_live_client_sends_it(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, label: str
) -> None:
    # The described headers were encoded as Latin-1: a label outside it was a 500 (and a
    # logged traceback); with a routing rule reading labels, an accented one was "not valid
    # JSON" where the live request served (here it pins that both still answer).
    a = await fake_upstreams("a")
    gw = await gateway_factory(config(model("a", route(a)), admin_key=ADMIN))
    metadata = json.dumps({"t": label}, ensure_ascii=False)

    explained = await _explain(gw, chat("a"), headers={"x-llmgw-metadata": metadata})
    live = await gw.http().post(
        CHAT, json=chat("a"), headers=[(b"x-llmgw-metadata", metadata.encode())]
    )

    assert explained["plan"]["model"] == "a", explained
    assert live.status_code == 200, live.text


async def test_explain_of_a_half_open_route_reports_its_probe_without_taking_it(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # A dry run must not lease the single probe: the next live request is the probe.
    gw = await gateway_factory(
        config(model("m", route(fake_upstream)), circuit=HALF_OPEN_SOON, admin_key=ADMIN)
    )
    endpoint = eid("m", fake_upstream)
    fake_upstream.enqueue(Reply(500), Reply(500))
    http = gw.http()

    async with circuit_events(gw) as events:
        await http.post(CHAT, json=chat("m"))
        await http.post(CHAT, json=chat("m"))
        await events.circuit("open")
        await events.circuit("half_open")
        explained = [await _explain(gw, {"model": "m", "messages": HI}) for _ in range(2)]
        live = await http.post(CHAT, json=chat("m"))
        closed = await events.circuit("closed")

    for result in explained:
        assert [(c["endpoint"], c["probe"]) for c in result["plan"]["candidates"]] == [
            (endpoint, True)
        ]
    assert live.status_code == 200, live.text
    assert live.headers["x-routed-via"] == endpoint
    assert closed.old == "half_open"
    assert len(fake_upstream.requests) == 3  # explain called no upstream


async def test_explain_with_auth_on_and_no_described_credential_answers_as_the_asking_admin(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # The live path would refuse a keyless request; explain answers as the admin asking, who
    # may see a model of role pro.
    gw = await gateway_factory(
        keys_config(
            tmp_path, model("m", route(fake_upstream), required_role="pro"), auth="required"
        )
    )
    live = await gw.http().post(CHAT, json=chat("m"))
    result = await _explain(gw, {"model": "m", "messages": HI})

    assert_openai_error(live, 401, "unauthorized")
    assert result["plan"]["model"] == "m"
    assert result["plan"]["candidates"][0]["endpoint"] == eid("m", fake_upstream)
