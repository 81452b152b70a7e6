"""Capacity routes through the real server with the openai SDK, on both buses: a ``local``
quota route stops receiving traffic at its limit (the other route takes it) and resumes when
its window has passed; an ``http_json`` quota source that does not resolve is reported (the
``quota`` event, a ``/health/deep`` line, a warning log) and its route is not drawn; a
reload that adds or changes an ``http_json`` source has it polled without a restart; a pool
a reload removed while its slots were held comes back with none of them held.

The actors run on a skewed clock (``actor_clock``): the test jumps it past the quota window
and awaits the pool's CapacityState event instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import openai
import pytest
import yaml

from gateway.admin.http import admin_request
from schemas import CapacityGet, CapacityRelease, CapacityState, QuotaSourceStatus, subjects
from tests.e2e.conftest import (
    HI,
    WAIT,
    SkewedClock,
    assert_openai_error,
    config,
    eid,
    gateway_bus,
    model,
    route,
    watch,
)
from tests.e2e.keys_support import keys_config
from tests.e2e.limits_support import new_key, set_limit
from tests.fixtures.upstream import Held, Reply, Stream, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

WINDOW = 3600.0
REFRESH = 2.0  # an http_json source's refresh: the test awaits its end, the quota event


async def test_a_local_quota_route_stops_at_its_limit_and_resumes_after_its_window(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    actor_clock: SkewedClock,
) -> None:
    plan, spare = await fake_upstreams("plan"), await fake_upstreams("spare")
    quota = route(
        plan,
        provider_type="quota",
        quota={"limit": 2},
        quota_source={"kind": "local", "window": WINDOW},
    )
    gw = await gateway_factory(config(model("m", quota, route(spare, fallback_only=True))))
    pool = eid("m", plan)
    client = gw.openai()

    async def served_by() -> str:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
        return str(raw.headers["x-routed-via"])

    async with watch(gw, subjects.capacity_state(pool)) as states:
        first = [await served_by() for _ in range(2)]
        await states.next(CapacityState, lambda s: s.used == 2)
        spilled = [await served_by() for _ in range(2)]
        assert len(plan.requests) == 2 and len(spare.requests) == 2

        actor_clock.advance(WINDOW + 1)  # the two charges leave the rolling window
        await gateway_bus(gw).request(
            subjects.capacity_get(pool), CapacityGet(pool=pool), reply_type=CapacityState, timeout=5
        )
        await states.next(CapacityState, lambda s: s.used == 0)
        resumed = await served_by()

    assert first == [pool, pool]
    assert spilled == [eid("m", spare)] * 2
    assert resumed == pool
    assert len(plan.requests) == 3 and len(spare.requests) == 2


async def test_a_mistyped_http_json_quota_source_is_reported_and_its_route_not_drawn(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan, spare = await fake_upstreams("plan"), await fake_upstreams("spare")
    plan.set_default(Reply(200, body={"data": {"used": 3, "limit": 100}}), path="/usage")
    quota = route(
        plan,
        weight=100,
        provider_type="quota",
        api_key="sk-plan-secret",
        quota_source={
            "kind": "http_json",
            "url": f"{plan.base_url}/usage",
            "used_path": "data.usd",
            "limit_path": "data.limit",
            "refresh_seconds": REFRESH,
        },
    )
    caplog.set_level(logging.WARNING)
    gw = await gateway_factory(config(model("m", quota, route(spare, weight=1))))
    async with watch(gw, subjects.event("quota")) as events:
        # Reported once the first refresh is over without a reading.
        reported = await events.next(
            QuotaSourceStatus, lambda e: not e.resolved, timeout=REFRESH + WAIT
        )
    answers = [
        await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
        for _ in range(3)
    ]
    deep = (await gw.http().get("/health/deep")).json()

    pool = eid("m", plan)
    assert reported.pool == pool and reported.endpoints == (pool,)
    assert "data.usd" in reported.reason
    assert {a.headers["x-routed-via"] for a in answers} == {eid("m", spare)}
    assert plan.requests_to("/v1/chat/completions") == []
    line = deep["capacity"][pool]
    assert line["resolved"] is False and "data.usd" in line["reason"]
    assert line["routes"] == [pool]
    assert deep["status"] == "degraded"
    warnings = [r.getMessage() for r in caplog.records if "quota source" in r.getMessage()]
    assert any(pool in w and "data.usd" in w for w in warnings), warnings
    text = caplog.text + repr(reported) + str(deep)
    assert "sk-plan-secret" not in text


async def test_a_stream_gives_its_concurrency_slot_back_however_it_ends(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    slot, spare = await fake_upstreams("slot"), await fake_upstreams("spare")
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(slot, provider_type="concurrency", concurrency={"limit": 1}),
                route(spare, fallback_only=True),
            )
        )
    )
    pool = eid("m", slot)
    client = gw.openai()
    slot.enqueue(Stream(stall_after=1), Stream(cut_after=1))
    async with watch(gw, subjects.capacity_state(pool)) as states:
        # The client goes away mid-stream: the relay ends, the slot comes back.
        stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
        async for _ in stream:
            break
        await states.next(CapacityState, lambda s: s.used == 1)
        await stream.close()
        await states.next(CapacityState, lambda s: s.used == 0)
        # The upstream cuts the stream: the answer ends in an error, the slot comes back.
        broken = await client.chat.completions.create(model="m", messages=HI, stream=True)
        with pytest.raises(openai.APIError):
            async for _ in broken:
                pass
        await states.next(CapacityState, lambda s: s.used == 1)
        await states.next(CapacityState, lambda s: s.used == 0)
        served = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    assert served.headers["x-routed-via"] == pool
    assert len(spare.requests) == 0


async def test_a_spent_quota_with_no_other_route_answers_503_with_when_it_resets(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    plan = await fake_upstreams("plan")
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(
                    plan,
                    provider_type="quota",
                    quota={"limit": 1},
                    quota_source={
                        "kind": "local",
                        "window": "daily",
                        "timezone": "America/New_York",
                    },
                ),
            )
        )
    )
    pool = eid("m", plan)
    async with watch(gw, subjects.capacity_state(pool)) as states:
        ok = await gw.http().post("/v1/chat/completions", json={"model": "m", "messages": HI})
        spent = await states.next(CapacityState, lambda s: s.used == 1)
    refused = await gw.http().post("/v1/chat/completions", json={"model": "m", "messages": HI})
    assert ok.status_code == 200
    err = assert_openai_error(refused, 503, "all_circuits_open")
    assert pool in err["message"]
    assert spent.resets_at is not None
    wait = int(refused.headers["retry-after"])
    assert 0 < wait <= 25 * 3600 and abs(wait - (spent.resets_at - spent.ts)) < WAIT
    assert len(plan.requests) == 1


async def test_an_http_json_quota_source_is_read_with_the_route_key_and_bounds_its_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    plan, spare = await fake_upstreams("plan"), await fake_upstreams("spare")
    plan.set_default(Reply(200, body={"usage": [{"used": 9, "limit": 10}]}), path="/usage")
    quota = route(
        plan,
        provider_type="quota",
        api_key="sk-plan-key",
        quota_source={
            "kind": "http_json",
            "url": f"{plan.base_url}/usage?team=a",
            "used_path": "usage.0.used",
            "limit_path": "usage.0.limit",
            "refresh_seconds": 600,
        },
    )
    gw = await gateway_factory(config(model("m", quota, route(spare, fallback_only=True))))
    pool = eid("m", plan)
    client = gw.openai()
    async with watch(gw, subjects.capacity_state(pool)) as states:
        state = await gateway_bus(gw).request(
            subjects.capacity_get(pool),
            CapacityGet(pool=pool),
            reply_type=CapacityState,
            timeout=WAIT,
        )
        assert isinstance(state, CapacityState)
        if not state.resolved:  # the first poll may still be on its way
            state = await states.next(CapacityState, lambda s: s.resolved)
        served = [
            (
                await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            ).headers["x-routed-via"]
            for _ in range(2)
        ]
    polls = plan.requests_to("/usage")
    assert (state.used, state.limit) == (9, 10)
    assert served == [pool, eid("m", spare)]  # one unit was left
    assert polls and polls[0].headers["authorization"] == "Bearer sk-plan-key"


async def test_a_reload_reaches_the_quota_poller_without_a_restart(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    plan, spare = await fake_upstreams("plan"), await fake_upstreams("spare")
    plan.set_default(Reply(200, body={"data": {"used": 3, "other": 7, "limit": 10}}), path="/usage")
    path = tmp_path / "gw.yaml"
    database = {"path": str(tmp_path / "gw.sqlite3")}

    def declared(*quota_route: dict[str, Any]) -> dict[str, Any]:
        return config(model("m", route(spare), *quota_route), database=database)

    def source(used_path: str, key: str) -> dict[str, Any]:
        # A refresh far beyond the test: only the poll a reload starts can be seen.
        return route(
            plan,
            provider_type="quota",
            api_key=key,
            quota_source={
                "kind": "http_json",
                "url": f"{plan.base_url}/usage",
                "used_path": used_path,
                "limit_path": "data.limit",
                "refresh_seconds": 3600,
            },
        )

    gw = await gateway_factory(declared(), config_path=path)
    pool = eid("m", plan)
    async with watch(gw, subjects.capacity_state(pool)) as states:
        # A reload adds the pool: its source is polled (with the route's key) at once.
        path.write_text(yaml.safe_dump(declared(source("data.used", "sk-first"))))
        await admin_request(gateway_bus(gw), "config", "reload", by="test", timeout=WAIT)
        added = await states.next(CapacityState, lambda s: s.resolved)
        # A reload changes it: polled again at once, with the new path and key.
        path.write_text(yaml.safe_dump(declared(source("data.other", "sk-second"))))
        await admin_request(gateway_bus(gw), "config", "reload", by="test", timeout=WAIT)
        changed = await states.next(CapacityState, lambda s: s.resolved and s.used == 7)

    assert (added.used, added.limit) == (3, 10)
    assert changed.limit == 10
    assert [r.credential for r in plan.requests_to("/usage")] == ["sk-first", "sk-second"]


async def test_a_pool_a_reload_removed_while_its_slots_were_held_comes_back_with_none_held(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    slot, other = await fake_upstreams("slot"), await fake_upstreams("other")
    path, key = tmp_path / "gw.yaml", "adm-test-key"
    admin = {"authorization": f"Bearer {key}"}
    pooled = model(
        "m",
        route(slot, provider_type="concurrency", concurrency={"limit": 2}, concurrency_pool="box"),
    )

    def declared(*models: dict[str, Any]) -> dict[str, Any]:
        database = {"path": str(tmp_path / "gw.sqlite3")}
        return config(model("o", route(other)), *models, admin_key=key, database=database)

    gw = await gateway_factory(declared(pooled), config_path=path)
    client, http = gw.openai(), gw.http()

    async def reload(to: dict[str, Any]) -> list[str]:
        # Over HTTP: answered once this ingress serves the new config.
        path.write_text(yaml.safe_dump(to))
        reply = await http.post("/admin/config/reload", json={}, headers=admin)
        assert reply.status_code == 200, reply.text
        return list(reply.json()["children"])

    slot.set_default(Held())
    async with (
        watch(gw, subjects.capacity_state("box")) as states,
        watch(gw, subjects.capacity_release("box")) as releases,
    ):
        calls = [
            asyncio.create_task(
                client.chat.completions.with_raw_response.create(model="m", messages=HI)
            )
            for _ in range(2)
        ]
        await slot.wait_for_requests(2)
        await states.next(CapacityState, lambda s: s.used == 2)  # both slots held
        removed = await reload(declared())
        slot.release_held()
        answered = [(await call).status_code for call in calls]
        for _ in calls:  # each release sent, with no owner left to take it
            await releases.next(CapacityRelease)
        added = await reload(declared(pooled))
        state = await gateway_bus(gw).request(
            subjects.capacity_get("box"),
            CapacityGet(pool="box"),
            reply_type=CapacityState,
            timeout=WAIT,
        )
        served = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
        deep = (await http.get("/health/deep", headers=admin)).json()

    assert "remove capacity/capacity:box" in removed
    assert "add capacity/capacity:box" in added
    assert answered == [200, 200]
    assert isinstance(state, CapacityState) and state.used == 0  # no slot held by the past
    assert served.headers["x-routed-via"] == eid("m", slot)  # not 503 until the leases' TTL
    assert deep["capacity"]["box"]["used"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
async def test_an_attempt_the_upstream_refused_gives_its_token_estimate_back(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    stream: bool,
) -> None:
    plan, spare = await fake_upstreams("plan"), await fake_upstreams("spare")
    plan.set_default(Reply(500))
    quota = route(
        plan,
        provider_type="quota",
        quota={"limit": 100000},
        quota_source={"kind": "local", "unit": "tokens", "window": "daily"},
    )
    gw = await gateway_factory(config(model("m", quota, route(spare, fallback_only=True))))
    pool = eid("m", plan)
    words = [{"role": "user", "content": "count these words " * 50}]
    async with watch(gw, subjects.capacity_state(pool)) as states:
        if stream:
            chunks = await gw.openai().chat.completions.create(
                model="m", messages=words, stream=True
            )
            received = [c async for c in chunks]  # read to the end
            served = received[0].model_dump()
        else:
            served = (
                await gw.openai().chat.completions.create(model="m", messages=words)
            ).model_dump()
        reserved = await states.next(CapacityState, lambda s: s.used > 0)
    after = await gateway_bus(gw).request(
        subjects.capacity_get(pool), CapacityGet(pool=pool), reply_type=CapacityState, timeout=WAIT
    )

    assert served["id"] and len(plan.requests_to("/v1/chat/completions")) == 1
    assert len(spare.requests_to("/v1/chat/completions")) == 1
    assert reserved.used >= 50  # the prompt estimate was reserved for the attempt
    assert isinstance(after, CapacityState) and after.used == 0  # refused: nothing was used


@pytest.mark.parametrize("unit", ["requests", "tokens"])
async def test_requests_a_callers_limits_refused_leave_a_quota_routes_allowance_alone(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path, unit: str
) -> None:
    # The plan leases its primary's quota before the caller's limits are asked: a refused
    # request gave the lease back but kept its charge (a request, or its prompt's estimate),
    # so a rate-limited client retrying drained a shared daily quota it never used.
    plan = await fake_upstreams("plan")
    limit = 100 if unit == "requests" else 100_000
    quota = route(
        plan,
        provider_type="quota",
        quota={"limit": limit},
        quota_source={"kind": "local", "unit": unit, "window": "daily"},
    )
    gw = await gateway_factory(keys_config(tmp_path, model("m", quota)))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=1)
    client = gw.http(headers={"authorization": f"Bearer {key}"})
    pool = eid("m", plan)

    answers = [
        await client.post("/v1/chat/completions", json={"model": "m", "messages": HI})
        for _ in range(5)
    ]
    state = await gateway_bus(gw).request(
        subjects.capacity_get(pool), CapacityGet(pool=pool), reply_type=CapacityState, timeout=WAIT
    )

    assert [a.status_code for a in answers] == [200, 429, 429, 429, 429]
    assert len(plan.requests) == 1
    used = answers[0].json()["usage"]["total_tokens"] if unit == "tokens" else 1
    assert isinstance(state, CapacityState) and state.used == used, state
