"""``router: routewise`` through the real server with the openai SDK, on both buses: two fake
upstreams with set prices and first-token delays; once evidence exists (seeded by pinned
traffic), ``budget_alpha: 0`` sends the traffic to the cheap slow route and ``1`` to the fast
dear one, counted at the upstreams; ``/health/deep`` and explain show each candidate's
effective cost, latency estimate and LP weight."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from schemas import ModelStatus, Observation, RouteDecided, subjects
from tests.e2e.conftest import (
    HI,
    WAIT,
    config,
    eid,
    model,
    model_status,
    route,
    watch,
)
from tests.fixtures.upstream import FakeUpstream, Hang, Reply, Stream, UpstreamFactory
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-routewise"
CHEAP = {"prompt": 0.1, "completion": 0.2}
DEAR = {"prompt": 5.0, "completion": 20.0}
SEED = 3  # pinned requests per route before the policy has evidence
SERVED = 12


async def _profiled(gw: RunningGateway, count: int) -> ModelStatus:
    """The model's status once ``count`` candidates have latency evidence (a bounded loop of
    status requests, each awaited, while the actor takes in the observations)."""
    with anyio.fail_after(WAIT):
        while True:
            st = await model_status(gw)
            if sum(c.profiled for c in st.routewise) >= count:
                return st


async def _start(
    gateway_factory: GatewayFactory, cheap: FakeUpstream, fast: FakeUpstream, alpha: float
) -> RunningGateway:
    cheap.set_default(Reply(delay=0.25))
    return await gateway_factory(
        config(
            model(
                "m",
                route(cheap, pricing=CHEAP),
                route(fast, pricing=DEAR),
                router="routewise",
                router_params={"budget_alpha": alpha, "random_seed": 1},
            ),
            routing={"affinity": {"enabled": False}},
            admin_key=ADMIN,
        )
    )


async def _seed(gw: RunningGateway, *ups: FakeUpstream) -> None:
    client = gw.openai(api_key=ADMIN)
    for up in ups:
        for _ in range(SEED):
            await client.chat.completions.create(
                model="m", messages=HI, extra_headers={"X-Route-Pin": eid("m", up)}
            )
    await _profiled(gw, len(ups))


@pytest.mark.parametrize(("alpha", "winner"), [(0.0, "cheap"), (1.0, "fast")])
async def test_routewise_alpha_sends_traffic_to_the_cheap_or_the_fast_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    alpha: float,
    winner: str,
) -> None:
    cheap, fast = await fake_upstreams("cheap"), await fake_upstreams("fast")
    gw = await _start(gateway_factory, cheap, fast, alpha)
    await _seed(gw, cheap, fast)
    before = {"cheap": len(cheap.requests), "fast": len(fast.requests)}

    client = gw.openai()
    for _ in range(SERVED):
        answer = await client.chat.completions.create(model="m", messages=HI)
        assert answer.choices[0].message.content

    served = {
        "cheap": len(cheap.requests) - before["cheap"],
        "fast": len(fast.requests) - before["fast"],
    }
    assert served[winner] == SERVED, served


async def test_routewise_health_and_explain_show_costs_latencies_and_lp_weights(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    cheap, fast = await fake_upstreams("cheap"), await fake_upstreams("fast")
    gw = await _start(gateway_factory, cheap, fast, 1.0)
    await _seed(gw, cheap, fast)

    async with httpx.AsyncClient(base_url=gw.url) as http:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        deep = (await http.get("/health/deep", headers=headers)).json()
        resp = await http.post(
            "/admin/routing/explain", headers=headers, json={"body": {"model": "m", "messages": HI}}
        )
        assert resp.status_code == 200, resp.text
        explained = resp.json()

    rows: dict[str, Any] = {c["endpoint"]: c for c in deep["routewise"]["m"]["candidates"]}
    c, f = rows[eid("m", cheap)], rows[eid("m", fast)]
    assert c["effective_cost_usd"] < f["effective_cost_usd"]
    assert c["latency_ms"] > f["latency_ms"] >= 0 and c["profiled"] and f["profiled"]
    assert f["lp_weight"] == 1.0 and c["lp_weight"] == 0.0
    assert f["quota_used_fraction"] is None and f["free_slots"] is None
    plan_rows = {r["endpoint"]: r for r in explained["plan"]["routewise"]}
    assert plan_rows[eid("m", fast)]["lp_weight"] == 1.0
    assert explained["plan"]["candidates"][0]["endpoint"] == eid("m", fast)


async def _served_by(
    gw: RunningGateway, cheap: FakeUpstream, fast: FakeUpstream, n: int
) -> dict[str, int]:
    before = {"cheap": len(cheap.requests), "fast": len(fast.requests)}
    client = gw.openai()
    for _ in range(n):
        await client.chat.completions.create(model="m-alias", messages=HI)
    return {
        "cheap": len(cheap.requests) - before["cheap"],
        "fast": len(fast.requests) - before["fast"],
    }


async def test_routewise_admin_setting_changes_routing_on_the_next_request_and_survives_restart(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    cheap, fast = await fake_upstreams("cheap"), await fake_upstreams("fast")
    cheap.set_default(Reply(delay=0.25))
    cfg = config(
        model(
            "m",
            route(cheap, pricing=CHEAP),
            route(fast, pricing=DEAR),
            aliases=["m-alias"],
            router="routewise",
            router_params={"budget_alpha": 0.0, "random_seed": 1},
        ),
        routing={"affinity": {"enabled": False}},
        admin_key=ADMIN,
    )
    gw = await gateway_factory(cfg)
    await _seed(gw, cheap, fast)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    path = "/admin/routewise/model-settings"

    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
        first = await _served_by(gw, cheap, fast, 4)
        patched = await http.patch(
            f"{path}/budget_alpha", params={"model_id": "m-alias"}, json={"value": 1.0}
        )
        second = await _served_by(gw, cheap, fast, 4)
        refused = await http.patch(
            f"{path}/quota_limit", params={"model_id": "m"}, json={"value": 5}
        )
        async with httpx.AsyncClient(base_url=gw.url) as bare:
            anonymous = await bare.get(path, params={"model_id": "m"})
    assert await gw.stop() == 0

    gw = await gateway_factory(cfg)  # same database: the snapshot and the request log
    await _profiled(gw, 2)  # evidence replayed from the request log
    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
        kept = (await http.get(path, params={"model_id": "m"})).json()
        third = await _served_by(gw, cheap, fast, 4)
        deleted = await http.delete(f"{path}/budget_alpha", params={"model_id": "m"})
        fourth = await _served_by(gw, cheap, fast, 4)

    assert first == {"cheap": 4, "fast": 0}
    assert patched.status_code == 200, patched.text
    assert patched.json()["settings"]["budget_alpha"] == {"value": 1.0, "source": "model_override"}
    assert second == {"cheap": 0, "fast": 4}
    assert refused.status_code == 400 and "quota_limit" in refused.json()["error"]["message"]
    assert anonymous.status_code == 401
    assert kept["settings"]["budget_alpha"] == {"value": 1.0, "source": "model_override"}
    assert third == {"cheap": 0, "fast": 4}
    assert deleted.json()["settings"]["budget_alpha"] == {"value": 0.0, "source": "router_params"}
    assert fourth == {"cheap": 4, "fast": 0}


async def test_routewise_deployment_fallback_applies_below_router_params(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    cheap, fast = await fake_upstreams("cheap"), await fake_upstreams("fast")
    cheap.set_default(Reply(delay=0.25))
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(cheap, pricing=CHEAP),
                route(fast, pricing=DEAR),
                aliases=["m-alias"],
                router="routewise",
                router_params={"random_seed": 1},
            ),
            routing={"affinity": {"enabled": False}},
            admin_key=ADMIN,
        )
    )
    await _seed(gw, cheap, fast)
    async with httpx.AsyncClient(
        base_url=gw.url, headers={"Authorization": f"Bearer {ADMIN}"}
    ) as http:
        low = await http.patch("/admin/routewise/settings", json={"budget_alpha": 0.0})
        at_zero = await _served_by(gw, cheap, fast, 4)
        shown = (await http.get("/admin/routewise/settings")).json()
        await http.patch("/admin/routewise/settings", json={"budget_alpha": 1.0})
        at_one = await _served_by(gw, cheap, fast, 4)
        # Of the wrong JSON type: taken and stored as sent (a number that was ``true``).
        mistyped = {"budget_alpha": True, "db_bootstrap_max_rows": True, "random_seed": 1.5}
        wrong = {
            key: await http.patch("/admin/routewise/settings", json={key: value})
            for key, value in {**mistyped, "routewise_probe_enabled": 0}.items()
        }
        as_text = await http.patch(
            "/admin/routewise/model-settings/budget_alpha",
            params={"model_id": "m"},
            json={"value": "0.5"},
        )
        after = (await http.get("/admin/routewise/settings")).json()
        per_model = await http.get("/admin/routewise/model-settings", params={"model_id": "m"})

    assert low.status_code == 200, low.text
    assert at_zero == {"cheap": 4, "fast": 0} and at_one == {"cheap": 0, "fast": 4}
    assert shown["fallback"] == {"budget_alpha": 0.0}
    for key, resp in [*wrong.items(), ("budget_alpha", as_text)]:
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == key, resp.text
    assert after["fallback"] == {"budget_alpha": 1.0}
    assert per_model.json()["settings"]["budget_alpha"]["source"] == "deployment_fallback"


async def test_routewise_prober_seeds_the_evidence_that_moves_traffic_to_the_fast_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    cheap, fast = await fake_upstreams("cheap"), await fake_upstreams("fast")
    cheap.set_default(Reply(delay=0.25))
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(cheap, pricing=CHEAP),
                route(fast, pricing=DEAR),
                aliases=["m-alias"],
                router="routewise",
                router_params={
                    "budget_alpha": 1.0,
                    "routewise_probe_enabled": True,
                    "routewise_probe_interval_sec": 0.05,
                    "routewise_probe_max_concurrency": 2,
                },
            ),
            routing={"affinity": {"enabled": False}},
        )
    )
    await _profiled(gw, 2)  # no client traffic yet: the prober measured both routes
    probes = {"cheap": len(cheap.requests), "fast": len(fast.requests)}
    probe_bodies = [r.json for r in (*cheap.requests, *fast.requests)]
    served = await _served_by(gw, cheap, fast, 4)

    assert probes["cheap"] >= 1 and probes["fast"] >= 1
    assert all(b.get("max_tokens") == 1 for b in probe_bodies)
    assert served == {"cheap": 0, "fast": 4}


HEDGED = 5  # samples per route before hedging trusts the profiles (the library's minimum)


async def _hedging_gateway(
    gateway_factory: GatewayFactory,
    slow: FakeUpstream,
    fast: FakeUpstream,
    slow_kind: dict[str, Any] | None = None,
    **slow_route: Any,
) -> RunningGateway:
    """Alpha 0 makes the cheap ``slow`` route the primary; its history misses the 0.3 s SLO
    every time, the dear ``fast`` one never does, so plans carry a hedge checkpoint.
    ``slow_kind``: the slow route's kind and its settings (default: ``openai_compat``);
    ``slow_route``: more settings of the slow route."""
    slow.set_default(Reply(delay=0.4))
    gw = await gateway_factory(
        config(
            model(
                "m",
                {**route(slow, pricing=CHEAP, **slow_route), **(slow_kind or {})},
                route(fast, pricing=DEAR),
                aliases=["m-alias"],
                router="routewise",
                router_params={
                    "budget_alpha": 0.0,
                    "latency_slo_sec": 0.3,
                    "latency_hedge_mode": "probability_target",
                },
            ),
            routing={"affinity": {"enabled": False}},
            admin_key=ADMIN,
        )
    )
    client = gw.openai(api_key=ADMIN)
    for up in (slow, fast):
        for _ in range(HEDGED):
            await client.chat.completions.create(
                model="m", messages=HI, extra_headers={"X-Route-Pin": eid("m", up)}
            )
    with anyio.fail_after(WAIT):
        while min(c.samples for c in (await model_status(gw)).routewise) < HEDGED:
            pass
    return gw


@pytest.mark.parametrize("stream", [False, True])
async def test_routewise_hedge_serves_from_the_backup_when_the_primary_stalls(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    stream: bool,
) -> None:
    slow, fast = await fake_upstreams("slow"), await fake_upstreams("fast")
    gw = await _hedging_gateway(gateway_factory, slow, fast)
    slow.set_default(Stream(first_byte_delay=60.0) if stream else Hang())
    sent_slow, sent_fast = len(slow.requests), len(fast.requests)
    client = gw.openai()

    async with watch(gw, subjects.observation(eid("m", slow))) as slow_obs:
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="m", messages=HI, stream=True
                )
            ]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finishes = [
                c.choices[0].finish_reason
                for c in chunks
                if c.choices and c.choices[0].finish_reason
            ]
        else:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            answer = raw.parse()
            text, finishes = answer.choices[0].message.content or "", ["stop"]
            assert raw.headers["x-routed-via"] == eid("m", fast)
        declined = await slow_obs.next(Observation, lambda o: o.error_kind == "hedge_declined")

    assert text and finishes == ["stop"]  # one clean answer, from one upstream
    assert len(slow.requests) == sent_slow + 1 and len(fast.requests) == sent_fast + 1
    assert declined.outcome == "cancelled"


@pytest.mark.parametrize("kind", ["gemini", "bedrock"])
async def test_routewise_hedges_a_stalled_platform_primary_and_lets_its_stream_go(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str
) -> None:
    """A platform route is hedged like any: its stalled stream loses the race, is declined
    (never a failure) and its upstream sees the client go."""
    fast = await fake_upstreams("fast")
    if kind == "bedrock":
        slow: FakeUpstream = await FakeBedrock("slow").start()
        settings = {"kind": "bedrock", "bedrock": {"region": BEDROCK_REGION}}
        settings |= {"provider_model_id": "amazon.nova-lite-v1:0", "api_key": BEDROCK_KEY}
        settings["base_url"] = slow.base_url
    else:
        slow = await fake_upstreams("slow")
        settings = {"kind": "gemini", "provider_model_id": "slow-model", "api_key": "g-key"}
        settings["base_url"] = slow.gemini_base_url
    try:
        gw = await _hedging_gateway(gateway_factory, slow, fast, slow_kind=settings)
        slow.set_default(Stream(first_byte_delay=60.0))
        sent_slow, sent_fast = len(slow.requests), len(fast.requests)

        async with watch(gw, subjects.observation(eid("m", slow))) as slow_obs:
            chunks = [
                c
                async for c in await gw.openai().chat.completions.create(
                    model="m", messages=HI, stream=True
                )
            ]
            declined = await slow_obs.next(Observation, lambda o: o.error_kind == "hedge_declined")
        await slow.wait_for_disconnects(1)
    finally:
        if kind == "bedrock":
            await slow.close()

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == fast.text  # one clean answer, from the backup
    assert len(slow.requests) == sent_slow + 1 and len(fast.requests) == sent_fast + 1
    assert slow.requests[-1].stream
    assert declined.outcome == "cancelled"


@pytest.mark.parametrize("stream", [False, True])
async def test_routewise_hedges_a_stalled_primary_whose_every_past_answer_was_fast(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, stream: bool
) -> None:
    """Eight fast answers say nothing about a primary that has not answered by a checkpoint:
    the backup is raced there, not after the primary's 8 s first-token timeout."""
    cheap, dear = await fake_upstreams("cheap"), await fake_upstreams("dear")
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(cheap, pricing=CHEAP, ttft_timeout_seconds=8),
                route(dear, pricing=DEAR),
                router="routewise",
                router_params={
                    "budget_alpha": 0.0,
                    "latency_slo_sec": 1.0,
                    "latency_hedge_mode": "probability_target",
                },
            ),
            routing={"affinity": {"enabled": False}},
            admin_key=ADMIN,
        )
    )
    admin = gw.openai(api_key=ADMIN)
    for up, n in ((cheap, 8), (dear, HEDGED)):
        for _ in range(n):
            await admin.chat.completions.create(
                model="m", messages=HI, extra_headers={"X-Route-Pin": eid("m", up)}
            )
    with anyio.fail_after(WAIT):
        while min(c.samples for c in (await model_status(gw)).routewise) < HEDGED:
            pass
    cheap.set_default(Stream(first_byte_delay=60.0) if stream else Hang())

    async with (
        watch(gw, subjects.observation(eid("m", cheap))) as cheap_obs,
        watch(gw, subjects.event("decision")) as decisions,
    ):
        raw = await gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=HI, stream=stream
        )
        if stream:
            text = "".join(
                [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
            )
        else:
            text = raw.parse().choices[0].message.content or ""
        rid = raw.headers["x-request-id"]
        primary = await cheap_obs.next(Observation, lambda o: o.request_id == rid)
        decided = await decisions.next(RouteDecided, lambda d: d.request_id == rid)

    assert raw.headers["x-routed-via"] == eid("m", dear) and text == dear.text
    assert (primary.outcome, primary.error_kind) == ("cancelled", "hedge_declined")
    assert decided.primary == eid("m", cheap) and decided.served == eid("m", dear)
    assert decided.status == 200


async def test_routewise_hedge_ignores_a_role_only_first_chunk_and_serves_all_from_the_backup(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    """The primary sends its role chunk at once, then stalls: that is no first token, so the
    hedge still fires and the client's whole answer, role chunk included, is the backup's.
    (The slow route's idle limit makes a primary that wrongly won at its role chunk end the
    client's stream in an error within the test, instead of stalling it.)"""
    slow, fast = await fake_upstreams("slow"), await fake_upstreams("fast")
    gw = await _hedging_gateway(gateway_factory, slow, fast, idle_timeout_seconds=5)
    slow.set_default(Stream(stall_after=0))  # the OpenAI role chunk, then nothing
    client = gw.openai()

    async with (
        watch(gw, subjects.observation(eid("m", slow))) as slow_obs,
        watch(gw, subjects.observation(eid("m", fast))) as fast_obs,
    ):
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, stream=True
        )
        chunks = [c async for c in raw.parse()]
        declined = await slow_obs.next(
            Observation, lambda o: o.request_id == raw.headers["x-request-id"]
        )
        served = await fast_obs.next(
            Observation, lambda o: o.request_id == raw.headers["x-request-id"]
        )

    assert raw.headers["x-routed-via"] == eid("m", fast)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == fast.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert {c.id for c in chunks} == {chunks[0].id} and "fast" in chunks[0].id
    (gone,) = await slow.wait_for_disconnects(1)  # the primary's stream was cancelled
    assert gone.stream
    assert (declined.outcome, declined.error_kind) == ("cancelled", "hedge_declined")
    assert served.outcome == "success" and served.ttft_ms is not None
