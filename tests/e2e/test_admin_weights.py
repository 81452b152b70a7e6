"""Effective weights through the real server: ``PUT``/``DELETE
/admin/routing/weights/{model}/{endpoint}`` (applied at once, refused when it would leave no
route or is negative, kept across a restart), the weight manager's local/remote split for the
``fixed`` router, and the ``health_check`` loop zeroing a local deployment that is down; all
as ``GET /routing`` reports them and traffic follows. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import pytest

from schemas import BenchChanged, LocalHealth, subjects
from tests.e2e.conftest import (
    CHAT,
    WAIT,
    assert_openai_error,
    chat,
    config,
    eid,
    model,
    route,
    watch,
)
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

T = TypeVar("T")
ADMIN = "adm-weights"
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
REMOTE = {
    "kind": "openai_compat",
    "base_url": "https://api.remote.example/v1",
    "provider_model_id": "remote-model",
}  # never called: weights only


def _path(model_id: str, endpoint: str) -> str:
    return f"/admin/routing/weights/{model_id}/{endpoint}"


async def _put(
    gw: RunningGateway,
    endpoint: str,
    body: Any,
    model_id: str = "m",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await gw.http().put(
        _path(model_id, endpoint), json=body, headers=ADMIN_AUTH if headers is None else headers
    )


async def _delete(gw: RunningGateway, endpoint: str, model_id: str = "m") -> httpx.Response:
    return await gw.http().delete(_path(model_id, endpoint), headers=ADMIN_AUTH)


async def _weights(gw: RunningGateway, model_id: str = "m") -> dict[str, float]:
    """Effective weight by endpoint, as ``GET /routing`` shows them."""
    resp = await gw.http().get("/routing")
    assert resp.status_code == 200, resp.text
    return {r["endpoint"]: r["weight"] for r in resp.json()["models"][model_id]["routes"]}


async def _eventually(ask: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T:
    """Ask the gateway again until its answer satisfies ``ok`` (views update by events)."""
    with anyio.fail_after(WAIT):
        while not ok(answer := await ask()):
            pass
    return answer


async def _vias(gw: RunningGateway, n: int) -> set[str]:
    return {(await gw.http().post(CHAT, json=chat("m"))).headers["x-routed-via"] for _ in range(n)}


def _config(a: FakeUpstream, b: FakeUpstream, wa: float = 1, wb: float = 1) -> dict[str, Any]:
    return config(
        model("m", route(a, wa), route(b, wb)),
        admin_key=ADMIN,
        routing={"affinity": {"enabled": False}},
    )


async def test_admin_weight_put_applies_at_once_and_delete_restores_the_configured_one(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    ea, eb = eid("m", a), eid("m", b)

    put = await _put(gw, ea, {"weight": 0})
    zeroed = await _weights(gw)
    vias = await _vias(gw, 12)  # all alike by chance: 1 in 2048
    await _put(gw, eb, {"weight": 3})
    await _put(gw, ea, {"weight": 0.5})
    moved = await _weights(gw)
    deleted = await _delete(gw, ea)
    await _delete(gw, eb)
    restored = await _weights(gw)

    assert put.status_code == 200
    assert put.json() == {
        "model": "m",
        "routes": [
            {
                "endpoint": ea,
                "weight": 0.0,
                "configured_weight": 1.0,
                "fallback_only": False,
                "overridden": True,
            },
            {
                "endpoint": eb,
                "weight": 1.0,
                "configured_weight": 1.0,
                "fallback_only": False,
                "overridden": False,
            },
        ],
    }
    assert zeroed == {ea: 0.0, eb: 1.0} and vias == {eb}
    assert moved == {ea: 0.5, eb: 3.0}
    assert deleted.status_code == 200 and restored == {ea: 1.0, eb: 1.0}


async def test_admin_weight_refusals_leave_the_weights_unchanged(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b, wb=0))
    ea = eid("m", a)

    last = await _put(gw, ea, {"weight": 0})
    negative = await _put(gw, ea, {"weight": -1})
    for bad in ({"weight": "heavy"}, {"weight": True}, {"w": 1}, [1]):
        assert_openai_error(await _put(gw, ea, bad), 400, "invalid_request")
    unknown_endpoint = await _put(gw, "m:nowhere", {"weight": 1})
    unknown_model = await _put(gw, ea, {"weight": 1}, model_id="nope")
    anonymous = await _put(gw, ea, {"weight": 2}, headers={})
    not_admin = await _put(gw, ea, {"weight": 2}, headers={"authorization": "Bearer sk-x"})

    assert "last route" in assert_openai_error(last, 400, "invalid_request")["message"]
    assert "from 0 to" in assert_openai_error(negative, 400, "invalid_request")["message"]
    assert_openai_error(unknown_endpoint, 404, "route_not_found")
    assert_openai_error(unknown_model, 404, "route_not_found")
    assert_openai_error(anonymous, 401, "unauthorized")
    assert_openai_error(not_admin, 401, "unauthorized")
    assert await _weights(gw) == {ea: 1.0, eid("m", b): 0.0}


async def test_admin_weight_override_survives_restarts_until_deleted(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    cfg = _config(a, b)
    ea, eb = eid("m", a), eid("m", b)
    gw = await gateway_factory(cfg)
    assert (await _put(gw, ea, {"weight": 0})).status_code == 200
    assert await gw.stop() == 0

    gw = await gateway_factory(cfg)  # same database
    kept = await _weights(gw)
    vias = await _vias(gw, 12)
    assert (await _delete(gw, ea)).status_code == 200
    assert await gw.stop() == 0

    gw = await gateway_factory(cfg)
    restored = await _weights(gw)

    assert kept == {ea: 0.0, eb: 1.0} and vias == {eb}
    assert restored == {ea: 1.0, eb: 1.0}


async def test_local_fraction_splits_weight_between_local_and_remote_routes_for_fixed_only(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    local = route(fake_upstream, 1)
    remote = {**REMOTE, "weight": 3}
    gw = await gateway_factory(
        config(
            model("m", local, remote),  # the default router, fixed
            model("own", local, remote, router_params={"local_fraction": 0.5}),
            model("rr", local, remote, router="round_robin"),
            routing={"local_fraction": 0.6},
            admin_key=ADMIN,
        )
    )
    ids = {m.id: m.endpoint_ids() for m in gw.config.models}

    split = await _weights(gw)
    own = await _weights(gw, "own")
    untouched = await _weights(gw, "rr")
    await _put(gw, ids["m"][0], {"weight": 2})  # an override feeds the split
    overridden = await _weights(gw)

    assert ids["m"][1] == "m:remote-api"
    assert split == pytest.approx({ids["m"][0]: 2.4, ids["m"][1]: 1.6})
    assert own == pytest.approx({ids["own"][0]: 2.0, ids["own"][1]: 2.0})
    assert untouched == {ids["rr"][0]: 1.0, ids["rr"][1]: 3.0}
    assert overridden == pytest.approx({ids["m"][0]: 3.0, ids["m"][1]: 2.0})


async def test_health_check_loop_zeroes_a_local_route_while_its_health_fails(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    health = "/v1/models"  # what the fake upstream answers GET on
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream, 1), {**REMOTE, "weight": 3}),
            routing={
                "local_fraction": 0.5,
                "health_check": {"enabled": True, "interval_seconds": 0.05, "path": health},
            },
        )
    )
    local, remote = gw.config.models[0].endpoint_ids()

    async with watch(gw, subjects.endpoint_local_health(local)) as verdicts:
        fake_upstream.set_default(Reply(503), path=health)
        await verdicts.next(LocalHealth, lambda v: not v.healthy)
        down = await _eventually(lambda: _weights(gw), lambda w: w[local] == 0)
        fake_upstream.set_default(Reply(), path=health)
        await verdicts.next(LocalHealth, lambda v: v.healthy)
        up = await _eventually(lambda: _weights(gw), lambda w: w[local] > 0)

    assert down == {local: 0.0, remote: 4.0}
    assert up == {local: 2.0, remote: 2.0}
    assert fake_upstream.requests_to(health) and not fake_upstream.requests_to(CHAT)


async def test_admin_routing_commands_over_the_bus_set_read_and_reset_weights(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    ea = eid("m", a)
    http = gw.http(headers=ADMIN_AUTH)

    refused = await http.post(
        "/admin/routing/set_weight", json={"model": "m", "endpoint": ea, "weight": -1}
    )
    set_ = await http.post(
        "/admin/routing/set_weight", json={"model": "m", "endpoint": ea, "weight": 4}
    )
    read = await http.get("/admin/routing/weights", params={"model": "m"})
    reset = await http.post("/admin/routing/reset_weight", json={"model": "m", "endpoint": ea})

    assert refused.status_code == 400
    assert set_.status_code == 200 and set_.json()["routes"][0]["weight"] == 4.0
    assert read.json()["models"][0]["routes"][0]["weight"] == 4.0
    assert reset.json()["routes"][0]["weight"] == 1.0
    assert await _weights(gw) == {ea: 1.0, eid("m", b): 1.0}


async def test_admin_bench_lift_over_the_bus_brings_a_benched_route_back(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    cfg = _config(a, b)
    cfg["routing"]["bench"] = {"failures": 1, "duration_seconds": 600}
    gw = await gateway_factory(cfg)
    ea = eid("m", a)
    a.enqueue(Reply(500))
    async with watch(gw, subjects.event("bench")) as benches:
        await _put(gw, eid("m", b), {"weight": 0.000001})  # the draw lands on a
        await gw.http().post(CHAT, json=chat("m"))
        benched = await benches.next(BenchChanged)
        lift = await gw.http(headers=ADMIN_AUTH).post("/admin/bench/lift", json={"endpoint": ea})
        lifted = await benches.next(BenchChanged)

    assert benched.benched and benched.endpoint == ea
    assert lift.status_code == 200
    assert (lifted.benched, lifted.endpoint) == (False, ea)
