"""A reload reaches the sidecars beside the actors (a real fake upstream, the in-process
bus): the quota poller stops polling a removed pool, the prober resolves a route the reload
added (its credential included), the health-check loop starts for a local route it added."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from actors import build_tree
from actors.state.route_table import candidate_for
from bus import InProcessBus
from gateway.adapters.registry import make_http_client
from gateway.process.quota_poller import QuotaPoller
from gateway.process.sidecars import HEALTH_CHECKED_UNIT, QUOTA_POLLED_UNIT, Sidecars
from schemas import LocalHealth, ProbeDue, QuotaReading, subjects
from schemas.config import GatewayConfig
from tests.fixtures.upstream import FakeUpstream, Reply

WAIT = 5.0


def _config(*routes: dict[str, Any], **routing: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"models": [{"id": "m", "route": list(routes)}], "routing": routing}
    )


def _quota(up: FakeUpstream) -> dict[str, Any]:
    return {
        "kind": "openai_compat",
        "base_url": up.openai_base_url,
        "provider_model_id": "x",
        "provider_type": "quota",
        "quota_source": {
            "kind": "http_json",
            "url": f"{up.base_url}/usage",
            "used_path": "used",
            "limit_path": "limit",
            "refresh_seconds": 3600,
        },
    }


async def test_a_reload_that_removes_a_pool_stops_polling_it(fake_upstream: FakeUpstream) -> None:
    fake_upstream.set_default(Reply(200, body={"used": 1, "limit": 5}), path="/usage")
    bus = InProcessBus()
    client = make_http_client()
    with_pool = _config(_quota(fake_upstream), {"kind": "echo"})
    pool = with_pool.models[0].endpoint_ids()[0]
    try:
        async with bus.subscribe(subjects.capacity_reading(pool)) as readings:
            poller = QuotaPoller(bus, client, with_pool)
            with anyio.fail_after(WAIT):
                reading = (await anext(aiter(readings))).message
        assert isinstance(reading, QuotaReading) and reading.used == 1
        [(_, task)] = poller._polling.values()
        poller.reconfigure(_config({"kind": "echo"}))
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and poller.pools == []
        await poller.aclose()
    finally:
        await client.aclose()
        await bus.aclose()


async def test_the_prober_resolves_a_route_a_reload_added_with_its_credential(
    fake_upstream: FakeUpstream,
) -> None:
    bus = InProcessBus()
    sidecars = Sidecars(bus, _config({"kind": "echo"}))
    added = _config(
        {"kind": "echo"},
        {
            "kind": "openai_compat",
            "api_key": "sk-added",
            "base_url": fake_upstream.openai_base_url,
            "provider_model_id": "x",
        },
    )
    endpoint = added.models[0].endpoint_ids()[1]
    candidate = candidate_for(endpoint, added.models[0].route[1])
    try:
        sidecars.reconfigure(added)
        result = await sidecars.prober.handle(
            ProbeDue(endpoint=endpoint, model="m", candidate=candidate)
        )
        assert result is not None and result.ok
        assert [r.credential for r in fake_upstream.requests] == ["sk-added"]
    finally:
        await sidecars.aclose()
        await bus.aclose()


async def test_the_health_check_loop_starts_for_a_local_route_a_reload_added(
    fake_upstream: FakeUpstream,
) -> None:
    bus = InProcessBus()
    sidecars = Sidecars(bus, _config({"kind": "echo"}))
    local = _config(
        {"kind": "echo"},
        {
            "kind": "openai_compat",
            "provider_model_id": "x",
            "base_url": fake_upstream.openai_base_url,
        },
        health_check={"enabled": True, "interval_seconds": 3600},
    )
    endpoint = local.models[0].endpoint_ids()[1]
    try:
        async with bus.subscribe(subjects.endpoint_local_health(endpoint)) as verdicts:
            sidecars.reconfigure(local)
            with anyio.fail_after(WAIT):
                verdict = (await anext(aiter(verdicts))).message
        assert isinstance(verdict, LocalHealth) and verdict.endpoint == endpoint
        assert [r.path for r in fake_upstream.requests] == ["/health"]
    finally:
        await sidecars.aclose()
        await bus.aclose()


def test_the_units_the_sidecars_feed_are_units_of_the_tree() -> None:
    config = _config({"kind": "echo"})
    units = {spec.name for spec in build_tree(config, request_log=True).specs}
    assert {HEALTH_CHECKED_UNIT, QUOTA_POLLED_UNIT} <= units


async def test_in_a_cluster_the_health_checks_and_quota_polls_run_only_beside_their_units_owner(
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.set_default(Reply(200, body={"used": 1, "limit": 5}), path="/usage")
    local = {
        "kind": "openai_compat",
        "provider_model_id": "x",
        "base_url": fake_upstream.openai_base_url,
    }
    config = _config(local, _quota(fake_upstream), health_check={"enabled": True})
    checked, pool = config.models[0].endpoint_ids()[:2]
    bus = InProcessBus()
    sidecars = Sidecars(bus, config)
    try:
        sidecars.place(["limits", "rules"])  # another host owns the models and the pools
        sidecars.actors_started()
        assert sidecars._checker is None and sidecars.poller.pools == []
        async with (
            bus.subscribe(subjects.endpoint_local_health(checked)) as verdicts,
            bus.subscribe(subjects.capacity_reading(pool)) as readings,
        ):
            sidecars.place(["limits", HEALTH_CHECKED_UNIT, QUOTA_POLLED_UNIT])  # a takeover
            with anyio.fail_after(WAIT):
                verdict = (await anext(aiter(verdicts))).message
                reading = (await anext(aiter(readings))).message
        assert isinstance(verdict, LocalHealth) and verdict.endpoint == checked
        assert isinstance(reading, QuotaReading) and reading.used == 1
        checker = sidecars._checker
        assert checker is not None and [p.pool for p in sidecars.poller.pools] == [pool]
        sidecars.place(["limits"])  # handed back
        await asyncio.gather(checker, return_exceptions=True)
        assert checker.cancelled() and sidecars._checker is None
        assert sidecars.poller.pools == []
    finally:
        await sidecars.aclose()
        await bus.aclose()
