"""Routing state that must not wedge, through the real server with the openai SDK: a
single-route model comes back by itself once its upstream does (the background probes of the
bench and of the muted sole key, after the circuit cooldown), ``bench lift`` lifts the key's
mute too, and an admin pin reaches a route whose only key is muted.

Events are awaited on the gateway's bus; durations are small configured ones. Runs on
``inproc://`` and on NATS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import BenchChanged, KeyMuted, KeyUnmuted, subjects
from schemas.config import credential_id
from tests.e2e.conftest import HI, assert_openai_error, config, eid, model, route, watch
from tests.e2e.keys_support import endpoint_state, pool_state
from tests.fixtures.gateway import RunningGateway, start_gateway
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

pytestmark = pytest.mark.e2e

ADMIN = "sk-admin-recovery"
ONLY = "sk-only"
# The spec's defaults (3 failures open the circuit and bench the route for 10 minutes; the
# only key tolerates 2, then mutes), with a cooldown a test can wait for.
SHORT_COOLDOWN = {"failure_threshold": 3, "cooldown_seconds": 0.5}


async def _fails(call: Callable[[], Awaitable[Any]]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        await call()
    return err.value


def _chat(gw: RunningGateway, **kw: Any) -> Callable[[], Awaitable[Any]]:
    client = gw.openai(**kw)
    return lambda: client.chat.completions.with_raw_response.create(model="m", messages=HI)


def _client_requests(up: FakeUpstream) -> int:
    """Requests from clients (background probes ask for one token)."""
    return sum(1 for r in up.requests if r.json and r.json.get("max_tokens") != 1)


async def test_single_route_model_after_three_failures_is_served_again_once_its_probes_pass(
    gateway_factory: Callable[..., Awaitable[RunningGateway]],
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500), Reply(500), Reply(500))  # then it is back
    gw = await gateway_factory(config(model("m", route(up, api_key=ONLY)), circuit=SHORT_COOLDOWN))
    send = _chat(gw)
    endpoint = eid("m", up)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as keys,
        watch(gw, subjects.event("circuit")) as circuits,
    ):
        failed = [await _fails(send) for _ in range(3)]
        benched = await benches.next(BenchChanged, lambda e: e.benched)
        muted = await keys.next(KeyMuted)
        refused = await _fails(send)  # nothing to send to until the probes say so
        # No bench lift: the probes after the cooldown bring the route and its key back.
        lifted = await benches.next(BenchChanged, lambda e: not e.benched)
        unmuted = await keys.next(KeyUnmuted)
        await circuits.circuit("half_open", endpoint)
        served = await send()  # the half-open probe
        closed = await circuits.circuit("closed", endpoint)

    assert [f.status_code for f in failed] == [502, 502, 502]
    assert benched.until is not None and benched.until - benched.ts == pytest.approx(600)
    assert muted.credential_id == unmuted.credential_id == credential_id(ONLY)
    assert refused.status_code == 503 and "retry-after" in refused.response.headers
    assert lifted.reason == "background probe succeeded"
    assert lifted.ts < benched.ts + 60  # after the cooldown, not halfway through the bench
    assert served.headers["x-routed-via"] == endpoint
    assert served.parse().choices[0].message.content
    assert _client_requests(up) == 4
    assert all(r.credential == ONLY for r in up.requests)
    assert closed.reason == "probe succeeded"


async def test_bench_lift_also_lifts_the_mute_of_the_routes_only_key(
    gateway_factory: Callable[..., Awaitable[RunningGateway]],
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500))
    # One failure benches the route for 10 minutes and mutes its only key for 10 minutes; the
    # cooldown (and so every probe) is further away than the test waits.
    gw = await gateway_factory(_muting_config(up, bench_failures=1))
    send = _chat(gw)
    endpoint = eid("m", up)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as keys,
    ):
        await _fails(send)
        await benches.next(BenchChanged, lambda e: e.benched)
        await keys.next(KeyMuted)
        lift = await gw.http(headers={"authorization": f"Bearer {ADMIN}"}).post(
            "/admin/bench/lift", json={"endpoint": endpoint}
        )
        await benches.next(BenchChanged, lambda e: not e.benched)
        unmuted = await keys.next(KeyUnmuted)
        served = await send()

    assert lift.status_code == 200, lift.text
    assert unmuted.credential_id == credential_id(ONLY)
    assert served.headers["x-routed-via"] == endpoint
    assert len(up.requests) == 2


async def test_admin_pin_reaches_a_route_whose_only_key_is_muted(
    gateway_factory: Callable[..., Awaitable[RunningGateway]],
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500))
    gw = await gateway_factory(_muting_config(up, bench_failures=100))
    endpoint = eid("m", up)
    admin = gw.openai(api_key=ADMIN)

    async with watch(gw, subjects.event("keypool")) as keys:
        await _fails(_chat(gw))
        await keys.next(KeyMuted)
        refused = await _fails(_chat(gw))  # an unpinned request has no key to spend
        pinned = await admin.chat.completions.with_raw_response.create(
            model="m", messages=HI, extra_headers={"X-Route-Pin": endpoint}
        )

    assert_openai_error(refused.response, 503, "key_pool_exhausted")
    assert pinned.status_code == 200
    assert pinned.headers["x-routed-via"] == endpoint
    assert [r.credential for r in up.requests] == [ONLY, ONLY]


def _muting_config(up: FakeUpstream, *, bench_failures: int) -> dict[str, Any]:
    """The route's only key is muted for 10 minutes by its first failure; the circuit
    cooldown (and so every probe) is further away than a test waits."""
    return config(
        model("m", route(up, api_key=ONLY)),
        admin_key=ADMIN,
        circuit={"failure_threshold": 100, "cooldown_seconds": 600},
        routing={
            "bench": {"failures": bench_failures},
            "key_pool": {"sole_key_tolerance": 0, "sole_key_backoff_seconds": 600},
        },
    )


def _stuck_config(up: FakeUpstream) -> dict[str, Any]:
    """One failure opens the circuit, benches the route and mutes its only key, each for 10
    minutes (no probe is due within the test)."""
    return config(
        model("m", route(up, api_key=ONLY)),
        circuit={"failure_threshold": 1, "cooldown_seconds": 600},
        routing={
            "bench": {"failures": 1, "duration_seconds": 600},
            "key_pool": {
                "sole_key_tolerance": 0,
                "sole_key_backoff_seconds": 600,
                "sole_key_backoff_max_seconds": 600,
            },
        },
    )


async def test_restart_keeps_the_open_circuit_the_bench_and_the_mute(
    gateway_factory: Callable[..., Awaitable[RunningGateway]],
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500))  # then it would answer: only the restored state keeps it out
    cfg = _stuck_config(up)
    endpoint = eid("m", up)
    gw = await gateway_factory(cfg)
    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as keys,
        watch(gw, subjects.event("circuit")) as circuits,
    ):
        await _fails(_chat(gw))
        opened = await circuits.circuit("open", endpoint)
        benched = await benches.next(BenchChanged, lambda e: e.benched)
        muted = await keys.next(KeyMuted)
    assert await gw.stop() == 0

    again = await gateway_factory(cfg)  # the same database file
    state = await endpoint_state(again, endpoint)
    pool = await pool_state(again, endpoint)
    refused = await _fails(_chat(again))

    assert state.circuit_state == "open"
    assert state.open_until == pytest.approx(opened.ts + 600, abs=1)
    assert state.benched_until == benched.until
    assert [k.muted_until for k in pool.keys] == [muted.until]
    assert refused.status_code == 503 and "retry-after" in refused.response.headers
    assert len(up.requests) == 1  # nothing reached the upstream after the restart


@pytest.mark.nats
async def test_actors_process_restart_keeps_the_circuit_bench_and_mute_for_a_running_ingress(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500))
    cfg = _stuck_config(up)
    endpoint = eid("m", up)
    actors = await start_gateway(cfg, nats_url, "actors", data_dir=tmp_path)
    ingress = await start_gateway(cfg, nats_url, "ingress", data_dir=tmp_path)
    try:
        async with watch(ingress, subjects.event("keypool")) as keys:
            await _fails(_chat(ingress))
            await keys.next(KeyMuted)
        assert await actors.stop() == 0
        actors = await start_gateway(cfg, nats_url, "actors", data_dir=tmp_path)
        state = await endpoint_state(ingress, endpoint)
        pool = await pool_state(ingress, endpoint)
        refused = await _fails(_chat(ingress))
    finally:
        await ingress.stop()
        await actors.stop()

    assert (state.circuit_state, state.benched_until is not None) == ("open", True)
    assert all(k.muted_until is not None for k in pool.keys)
    assert refused.status_code == 503
    assert len(up.requests) == 1
