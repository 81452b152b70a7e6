"""Session affinity through the real server with the openai SDK: who a caller is (API-key hash,
then ``grant:<id>``, then ``ip:<addr>`` with IPv6 folded to its /64, ``X-Forwarded-For`` only
when trusted), the five-minute sliding pin, dropping it on an error or when its endpoint is no
longer admissible, the kill switch, and pins outliving a restart.

Most tests pin a caller to ``a`` (weight 1 against ``b``'s 1e-9), then have an admin swap the
weights: from then on a fresh pick is ``b`` but for odds of 1e-9, so which endpoint a caller
reaches says whether it still holds its pin. Time is the actors' injectable clock
(``actor_clock``), never a sleep. Runs on ``inproc://`` and on NATS (``bus_url``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import (
    HALF_OPEN_SOON,
    STAYS_OPEN,
    SkewedClock,
    circuit_events,
    config,
    eid,
    model,
    route,
)
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    import openai

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-affinity"
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
TTL = 300.0  # the spec's five minutes, the default


def _config(
    a: FakeUpstream, b: FakeUpstream, *, circuit: dict[str, Any] | None = None, **routing: Any
) -> dict[str, Any]:
    return config(
        model("m", route(a, 1), route(b, 1e-9)),
        circuit=circuit or STAYS_OPEN,
        routing={"trust_proxy_headers": True, **routing},
        admin_key=ADMIN,
    )


async def _via(client: openai.AsyncOpenAI, ip: str | None = None, **headers: str) -> str:
    """The endpoint serving one request from ``ip`` (as X-Forwarded-For) with ``headers``."""
    if ip is not None:
        headers["X-Forwarded-For"] = ip
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
    )
    return str(raw.headers["x-routed-via"])


async def _weight(gw: RunningGateway, up: FakeUpstream, weight: float | None) -> None:
    """Set (or, with None, restore) the weight of ``up``'s route as the admin."""
    path = f"/admin/routing/weights/m/{eid('m', up)}"
    http = gw.http()
    resp = await (
        http.delete(path, headers=ADMIN_AUTH)
        if weight is None
        else http.put(path, json={"weight": weight}, headers=ADMIN_AUTH)
    )
    assert resp.status_code == 200, resp.text


async def _swap(gw: RunningGateway, a: FakeUpstream, b: FakeUpstream) -> None:
    """From now on a fresh pick is ``b`` (weights 1e-9 : 1); pins are untouched."""
    await _weight(gw, b, 1)
    await _weight(gw, a, 1e-9)


# -- stickiness, TTL ---------------------------------------------------------------------------


async def test_affinity_keeps_each_caller_on_one_endpoint_while_callers_spread(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    # Learned capacity off: on a loaded machine 12 requests in flight at one fake upstream
    # do queue, and a pin spills past a route at its learned limit; this checks the pin alone.
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b)),
            routing={"trust_proxy_headers": True, "learned_capacity": {"enabled": False}},
        )
    )
    client = gw.openai()

    async def caller(i: int) -> list[str]:
        return [await _via(client, f"10.1.0.{i}") for _ in range(4)]

    seen = await asyncio.gather(*(caller(i) for i in range(24)))

    for vias in seen:
        assert len(set(vias)) == 1, vias  # chance without a pin: 1 in 8 per caller
    firsts = Counter(vias[0] for vias in seen)
    assert set(firsts) == {eid("m", a), eid("m", b)}, firsts  # all alike: 1 in 8 million


async def test_affinity_pin_slides_for_five_minutes_of_silence_then_expires(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    actor_clock: SkewedClock,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    pinned = await _via(client, "10.0.0.1")
    await _swap(gw, a, b)

    kept = []
    # 870 s in all, never more than 290 s apart (real seconds pass too, on a busy machine
    # several): the TTL slides.
    for _ in range(3):
        actor_clock.advance(TTL - 10)
        kept.append(await _via(client, "10.0.0.1"))
    actor_clock.advance(TTL + 1)
    expired = await _via(client, "10.0.0.1")

    assert pinned == eid("m", a)
    assert kept == [eid("m", a)] * 3
    assert expired == eid("m", b)


# -- pin lifecycle -----------------------------------------------------------------------------


async def test_affinity_pin_is_dropped_when_its_endpoint_errors_and_the_next_pick_repins(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    first = await _via(client, "10.0.0.1")
    await _swap(gw, a, b)
    still = await _via(client, "10.0.0.1")
    a.enqueue(Reply(500))

    failed_over = await _via(client, "10.0.0.1")
    fresh = await _via(client, "10.0.0.1")
    await _weight(gw, a, None)  # a is the favourite again: only a pin keeps the caller on b
    await _weight(gw, b, None)
    repinned = await _via(client, "10.0.0.1")

    assert (first, still) == (eid("m", a), eid("m", a))
    assert failed_over == eid("m", b)  # fallback after a's error
    assert (fresh, repinned) == (eid("m", b), eid("m", b))
    assert len(a.requests) == 3


async def test_affinity_pin_to_a_zero_weight_endpoint_gives_way_to_a_fresh_pick_and_repin(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    first = await _via(client, "10.0.0.1")

    await _weight(gw, a, 0)
    fresh = await _via(client, "10.0.0.1")
    await _weight(gw, a, None)
    repinned = await _via(client, "10.0.0.1")

    assert (first, fresh, repinned) == (eid("m", a), eid("m", b), eid("m", b))


async def test_affinity_pin_to_an_open_circuit_gives_way_to_a_fresh_pick_and_repin(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    actor_clock: SkewedClock,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        _config(a, b, circuit={"failure_threshold": 1, "cooldown_seconds": 30})
    )
    client = gw.openai()
    first = await _via(client, "10.0.0.1")
    other = await _via(client, "10.0.0.2")
    a.enqueue(Reply(500))
    async with circuit_events(gw) as events:
        # Another caller's failure opens a's circuit; 10.0.0.1 keeps its pin to a.
        other_failed_over = await _via(client, "10.0.0.2")
        await events.circuit("open", eid("m", a))

    fresh = await _via(client, "10.0.0.1")
    actor_clock.advance(31)  # a's cooldown is over: a fresh pick would draw a's probe
    repinned = await _via(client, "10.0.0.1")

    assert (first, other, other_failed_over) == (eid("m", a), eid("m", a), eid("m", b))
    assert (fresh, repinned) == (eid("m", b), eid("m", b))
    assert len(a.requests) == 3


async def test_a_half_open_route_that_every_caller_is_pinned_away_from_is_probed_and_closes(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # The one busy caller is pinned to b, and a pin wins over the draw: none of its requests
    # takes a's half-open probe. The circuit must still close (the background probe), not
    # keep the route the operator weighted first out of rotation while that caller calls.
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b, circuit=HALF_OPEN_SOON, bench={"failures": 50}))
    client = gw.openai()
    await _swap(gw, a, b)
    busy = await _via(client, "10.0.0.1")  # pinned to b
    await _weight(gw, a, None)
    await _weight(gw, b, None)
    a.enqueue(Reply(500), Reply(500))
    async with circuit_events(gw) as events:
        # Another caller's two failures open a's circuit (each fails over to b).
        other = [await _via(client, "10.0.0.2") for _ in range(2)]
        await events.circuit("open", eid("m", a))
        await events.circuit("half_open", eid("m", a))
        during = await _via(client, "10.0.0.1")
        closed = await events.circuit("closed", eid("m", a))

    assert (busy, other, during) == (eid("m", b), [eid("m", b)] * 2, eid("m", b))
    assert closed.reason == "probe succeeded"
    assert [r.json.get("max_tokens") for r in a.requests] == [None, None, 1]  # the prober's


# -- who a caller is ---------------------------------------------------------------------------


async def test_affinity_key_folds_ipv6_addresses_to_their_64(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    first = await _via(client, "2001:db8:1:2::10")
    await _swap(gw, a, b)

    same_64 = await _via(client, "2001:db8:1:2:aaaa:bbbb:cccc:99")
    other_64 = await _via(client, "2001:db8:1:3::10")

    assert (first, same_64, other_64) == (eid("m", a), eid("m", a), eid("m", b))


@pytest.mark.parametrize(
    ("trust", "env", "distinct"),
    [
        (False, None, False),
        (True, None, True),
        (False, "1", True),
    ],
    ids=["untrusted", "trusted_by_config", "trusted_by_env"],
)
async def test_affinity_believes_x_forwarded_for_only_when_proxy_headers_are_trusted(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    trust: bool,
    env: str | None,
    distinct: bool,
) -> None:
    if env is not None:
        monkeypatch.setenv("TRUST_PROXY_HEADERS", env)
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b, trust_proxy_headers=trust))
    client = gw.openai()
    first = await _via(client, "10.0.0.1")
    await _swap(gw, a, b)

    # Untrusted, both requests are the loopback peer's: one caller, one pin.
    second = await _via(client, "10.0.0.2")

    assert first == eid("m", a)
    assert second == (eid("m", b) if distinct else eid("m", a))


async def test_affinity_key_of_a_grant_holder_is_its_grant_not_its_address(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    first = await _via(client, "10.0.0.1", **{"X-Inference-Grant": "g1"})
    await _swap(gw, a, b)

    moved = await _via(client, "10.0.0.9", **{"X-Inference-Grant": "g1"})
    other_grant = await _via(client, "10.0.0.1", **{"X-Inference-Grant": "g2"})
    same_address = await _via(client, "10.0.0.1")

    assert (first, moved) == (eid("m", a), eid("m", a))
    assert (other_grant, same_address) == (eid("m", b), eid("m", b))


async def test_affinity_key_of_an_api_key_caller_is_its_key_hash_before_grant_and_address(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    keys = []
    for user in ("u1", "u2"):
        resp = await gw.http().post(
            "/admin/keys", json={"org": "o", "user": user, "role": "free"}, headers=ADMIN_AUTH
        )
        assert resp.status_code == 201, resp.text
        keys.append(resp.json()["key"])
    one, two = gw.openai(api_key=keys[0]), gw.openai(api_key=keys[1])
    first = await _via(one, "10.0.0.1", **{"X-Inference-Grant": "g1"})
    await _swap(gw, a, b)

    moved = await _via(one, "10.0.0.9")
    other_key = await _via(two, "10.0.0.1", **{"X-Inference-Grant": "g1"})

    assert (first, moved) == (eid("m", a), eid("m", a))
    assert other_key == eid("m", b)


# -- kill switch, restart ----------------------------------------------------------------------


async def test_affinity_disabled_by_routing_affinity_enabled_0_makes_every_pick_fresh(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROUTING_AFFINITY_ENABLED", "0")
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    first = await _via(client, "10.0.0.1")
    await _swap(gw, a, b)

    second = await _via(client, "10.0.0.1")

    assert (first, second) == (eid("m", a), eid("m", b))


async def test_affinity_pins_survive_a_gateway_restart(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    cfg = _config(a, b)
    before = await gateway_factory(cfg)
    first = await _via(before.openai(), "10.0.0.1")
    await _swap(before, a, b)
    assert await before.stop() == 0

    after = await gateway_factory(cfg)  # same database
    client = after.openai()
    kept = await _via(client, "10.0.0.1")
    newcomer = await _via(client, "10.0.0.2")

    assert (first, kept, newcomer) == (eid("m", a), eid("m", a), eid("m", b))
