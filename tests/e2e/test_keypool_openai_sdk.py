"""Upstream key pools through the real gateway (spec "Reserving upstream keys for a tier"):
gateway keys made with the CLI, requests with the openai SDK, fake upstreams that record
which credential each request carried. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import KeyMuted, KeyUnmuted, Observation, subjects
from schemas.config import credential_id
from tests.e2e.conftest import eid, model, route, watch
from tests.e2e.keys_support import (
    admin_http,
    ask,
    create_keys,
    endpoint_state,
    keys_config,
    pool_state,
    spent,
)
from tests.fixtures.upstream import FakeUpstream, Reply, Reset, UpstreamFactory

# A 429 that says the key's quota is spent: muted like any key-specific failure (a plain 429
# is back-pressure and only cools the key, tests/e2e/test_backpressure_openai_sdk.py).
OUT_OF_QUOTA = Reply(
    429,
    body={"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}},
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

A, B, C, D = "sk-upstream-aaaa", "sk-upstream-bbbb", "sk-upstream-cccc", "sk-upstream-dddd"
MUTE = 2.0
TINY = 1e-6  # a fallback route's weight: drawn as primary about once in a million


async def test_keys_are_spent_in_order_a_failing_key_is_muted_and_bindings_hold(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    k1, k2, k3 = await create_keys(tmp_path, "free", "free", "free")
    # Long enough for two requests on a loaded machine; the test then waits for the unmute.
    gw = await gateway_factory(
        keys_config(
            tmp_path, model("m", route(up, api_keys=[A, B])), key_pool={"mute_seconds": MUTE}
        )
    )
    c1, c2, c3 = gw.openai(k1), gw.openai(k2), gw.openai(k3)

    await ask(c1)
    assert spent(up) == A  # declared order; c1 is now bound to A
    async with watch(gw, subjects.event("keypool")) as events:
        up.enqueue(OUT_OF_QUOTA)
        await ask(c1)
        assert spent(up) == B  # the same request, at once on the next key
        muted = await events.next(KeyMuted)
        assert (muted.credential_id, muted.status) == (credential_id(A), 429)
        assert muted.seconds == pytest.approx(MUTE, abs=0.1)
        await ask(c1)
        assert spent(up) == B  # around the muted key...
        await ask(c2)
        assert spent(up) == B  # ...and c2, new, binds to B
        await events.next(KeyUnmuted, lambda e: e.credential_id == credential_id(A))
    await ask(c1)
    assert spent(up) == A  # c1's binding to a merely muted key survived
    await ask(c2)
    assert spent(up) == B  # c2 stays bound to B although A is back
    await ask(c3)
    assert spent(up) == A  # a fresh caller starts at the top again


async def test_key_specific_failures_mute_and_a_request_error_does_not(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, api_keys=[A, B, C]))))
    client = gw.openai(key)

    up.enqueue(Reply(400))
    with pytest.raises(openai.BadRequestError):
        await ask(client)
    assert all(k.muted_until is None for k in (await pool_state(gw, eid("m", up))).keys)
    await ask(client)
    assert spent(up) == A
    async with watch(gw, subjects.event("keypool")) as events:
        up.enqueue(Reset())  # no status at all
        with pytest.raises(openai.APIStatusError):
            await ask(client)
        assert (await events.next(KeyMuted)).credential_id == credential_id(A)
        up.enqueue(Reply(401))
        await ask(client)
        assert spent(up) == C  # B refused: the same request went on to C
        muted = await events.next(KeyMuted)
        assert (muted.credential_id, muted.status) == (credential_id(B), 401)
        assert muted.seconds == pytest.approx(300, abs=5)  # the default mute
    await ask(client)
    assert spent(up) == C


def client_hits(up: FakeUpstream) -> list[Any]:
    """Requests a client sent (a muted key's background probe asks for one token)."""
    return [r for r in up.requests if r.json and r.json.get("max_tokens") != 1]


async def test_sole_key_tolerates_two_failures_then_backs_off_and_the_route_fails_over(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up1, up2 = await fake_upstreams("up1"), await fake_upstreams("up2")
    up1.set_default(Reply(500))
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(up1, api_keys=[A]), route(up2, TINY, api_keys=[B])),
            # Long enough that the next request surely meets the mute on a loaded machine.
            key_pool={"sole_key_backoff_seconds": 2.0, "sole_key_backoff_max_seconds": 8.0},
            routing={"affinity": {"enabled": False}},
        )
    )  # the fallback must not pin the caller
    client = gw.openai(key)
    route1 = eid("m", up1)

    for _ in range(2):  # the sole key's first two failures are tolerated
        await ask(client)
        assert spent(up2) == B
    assert all(k.muted_until is None for k in (await pool_state(gw, route1)).keys)
    async with watch(gw, subjects.event("keypool")) as events:
        await ask(client)
        first = await events.next(KeyMuted)
        assert first.seconds == pytest.approx(2.0, abs=0.1)
        tried = len(client_hits(up1))
        await ask(client)  # route1's pool is exhausted: it fails over to route2 unsent
        assert len(client_hits(up1)) == tried and spent(up2) == B
        await events.next(KeyUnmuted)
        await ask(client)
        assert len(client_hits(up1)) == tried + 1
        # (A background probe of the muted key fails too and re-mutes it: not the backoff.)
        second = await events.next(KeyMuted, lambda e: e.reason != "probe failed")
        assert second.seconds == pytest.approx(4.0, abs=0.1)  # doubling


async def test_all_keys_muted_answers_503_with_retry_after_and_charges_the_endpoint(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(up, api_keys=[A])),
            key_pool={"sole_key_tolerance": 0, "sole_key_backoff_seconds": 30},
        )
    )
    client = gw.openai(key)
    async with watch(gw, subjects.event("keypool")) as events:
        up.enqueue(Reply(503))
        with pytest.raises(openai.APIStatusError):
            await ask(client)
        await events.next(KeyMuted)
    async with watch(gw, subjects.observation(eid("m", up))) as observed:
        with pytest.raises(openai.APIStatusError) as info:
            await ask(client)
        # A pool usable by nobody is the endpoint's failure (a reservation is not: below).
        charged = await observed.next(Observation)
    assert (charged.outcome, charged.error_kind) == ("failure", "key_pool_exhausted")
    assert info.value.status_code == 503
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 30
    assert info.value.body["code"] == "key_pool_exhausted"  # type: ignore[index]
    assert len(up.requests) == 1


async def test_min_role_reserves_keys_and_a_reservation_refusal_is_not_charged(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up1, up2 = await fake_upstreams("up1"), await fake_upstreams("up2")
    free_key, pro_key = await create_keys(tmp_path, "free", "pro")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(up1, api_keys=[A, {"key": B, "min_role": "pro"}])),
            model("vip", route(up2, api_keys=[{"key": C, "min_role": "pro"}])),
            key_pool={"sole_key_tolerance": 0},
        )
    )  # A is free's only key: mute at once
    free, pro = gw.openai(free_key), gw.openai(pro_key)

    await ask(pro)
    assert spent(up1) == B  # the most reserved key first for those entitled to it
    await ask(free)
    assert spent(up1) == A  # B is invisible below pro
    for _ in range(3):
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await ask(free, "vip")
    assert denied.value.body["code"] == "key_pool_role_restricted"  # type: ignore[index]
    assert up2.requests == []
    vip = await endpoint_state(gw, eid("vip", up2))
    assert (vip.consecutive_failures, vip.circuit_state) == (0, "closed")
    await ask(pro, "vip")
    assert spent(up2) == C

    async with watch(gw, subjects.event("keypool")) as events:
        up1.enqueue(OUT_OF_QUOTA)
        with pytest.raises(openai.RateLimitError):
            await ask(free)
        await events.next(KeyMuted)
    for _ in range(2):  # free's only key is muted; pro's is not: a restriction, not charged
        with pytest.raises(openai.APIStatusError) as info:
            await ask(free)
        assert info.value.status_code == 503 and "retry-after" in info.value.response.headers
    assert (await endpoint_state(gw, eid("m", up1))).consecutive_failures == 1  # the quota 429 only
    await ask(pro)
    assert spent(up1) == B


async def test_admin_provider_keys_and_reservations_apply_to_live_pools(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    free_key, pro_key = await create_keys(tmp_path, "free", "pro")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, api_keys=[A]))))
    free, pro = gw.openai(free_key), gw.openai(pro_key)
    admin = admin_http(gw)
    pool = eid("m", up)
    await ask(pro)
    await ask(free)
    assert spent(up) == A

    added = await admin.post(
        "/admin/provider-keys", json={"key": D, "endpoint": pool, "min_role": "pro"}
    )
    assert added.status_code == 201, added.text
    assert D not in added.text and added.json()["credential_id"] == credential_id(D)
    await ask(pro)
    assert spent(up) == D  # pro's preferred key moved: its binding was dropped
    await ask(free)
    assert spent(up) == A

    lowered = await admin.post(
        f"/admin/provider-keys/{added.json()['id']}/min-role", json={"min_role": "free"}
    )
    assert lowered.status_code == 200, lowered.text
    await ask(pro)
    assert spent(up) == A  # both free now: declared order, config keys first

    reserved = await admin.post(
        "/admin/provider-keys/min-role-env", json={"key": A, "min_role": "internal"}
    )
    assert reserved.status_code == 200 and A not in reserved.text
    await ask(free)
    assert spent(up) == D
    gone = await admin.post(
        "/admin/provider-keys/min-role-env", json={"key": "sk-not-configured", "min_role": "pro"}
    )
    assert gone.status_code == 200

    listing = (await admin.get("/admin/provider-keys")).json()
    assert [k["credential_id"] for k in listing["database"]] == [credential_id(D)]
    (configured,) = listing["configured"]
    assert configured == {
        "credential_id": credential_id(A),
        "endpoints": [pool],
        "min_role": "free",
        "effective_min_role": "internal",
    }
    flags = {r["credential_id"]: r["configured"] for r in listing["reservations"]}
    assert flags == {credential_id(A): True, credential_id("sk-not-configured"): False}
    text = str(listing)
    assert A not in text and D not in text

    assert (await admin.delete(f"/admin/provider-keys/{added.json()['id']}")).status_code == 200
    with pytest.raises(openai.PermissionDeniedError):
        await ask(free)  # only A is left, and it is reserved for internal


async def test_anthropic_routes_take_their_credential_from_the_pool(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("claude")
    (key,) = await create_keys(tmp_path, "free")
    anthropic_route = {
        "kind": "anthropic",
        "base_url": up.anthropic_base_url,
        "provider_model_id": "claude-x",
        "api_keys": [A, B],
    }
    gw = await gateway_factory(keys_config(tmp_path, model("m", anthropic_route)))
    client = gw.openai(key)
    await ask(client)
    assert spent(up) == A and up.requests[-1].headers.get("x-api-key") == A
    async with watch(gw, subjects.event("keypool")) as events:
        up.enqueue(OUT_OF_QUOTA)
        await ask(client)
        assert spent(up) == B  # served at once by the next key
        await events.next(KeyMuted)
    await ask(client)
    assert spent(up) == B
