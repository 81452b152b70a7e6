"""Callers through the real gateway: gateway API keys made with ``llmgw keys``, auth switching
on, 401s, roles hiding models, admin-only surfaces, the affinity key, and the database
surviving a restart. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
from typing import TYPE_CHECKING, Any

import anthropic
import anyio
import openai
import pytest
import yaml

from schemas import AdminExecuted, ApiKeyRevoked, Observation, subjects
from schemas.config import credential_id
from tests.e2e.conftest import HI, eid, model, route, watch
from tests.e2e.keys_support import (
    ADMIN,
    admin_http,
    cli,
    create_keys,
    db_path,
    keys_config,
    pool_state,
)
from tests.fixtures.gateway import GatewayFactory, start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

UP_KEY = "sk-upstream-only-key"


async def ask(client: Any, model_id: str = "m") -> Any:
    return await client.chat.completions.create(model=model_id, messages=HI)


def one_model(tmp_path: Path, up: FakeUpstream, **extra: Any) -> dict[str, Any]:
    return keys_config(tmp_path, model("m", route(up, api_keys=[UP_KEY])), **extra)


async def test_without_keys_the_gateway_runs_open_and_says_so(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    assert "auth: OPEN" in caplog.text
    await ask(gw.openai("anything-at-all"))
    models = await gw.openai().models.list()
    assert [m.id for m in models.data if not m.id.startswith("auto")] == ["m"]


async def test_a_cli_key_closes_v1_and_unknown_expired_revoked_keys_get_401(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    await ask(gw.openai("anything"))  # open until a key exists
    made, expired = await asyncio.gather(
        cli(tmp_path, "create", "--org", "acme", "--user", "ann", "--role", "free"),
        cli(
            tmp_path,
            "create",
            "--org",
            "acme",
            "--user",
            "old",
            "--role",
            "free",
            "--expires-in",
            "1h",
        ),
    )
    # The hour has passed: a key cannot be created already expired.
    with sqlite3.connect(db_path(tmp_path)) as db:
        db.execute("UPDATE api_keys SET expires = 978307200 WHERE id = ?", (expired["id"],))
    key = made["key"]
    assert key.startswith("llmgw-") and made["status"] == "active"

    for presented, why in (
        (None, "missing"),
        ("llmgw-not-a-key", "invalid"),
        (expired["key"], "expired"),
    ):
        client = gw.openai(presented or "") if presented else gw.http()
        if presented is None:
            resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI})
            assert resp.status_code == 401 and why in resp.json()["error"]["message"]
            continue
        with pytest.raises(openai.AuthenticationError) as info:
            await ask(client)
        assert why in str(info.value)
    answer = await ask(gw.openai(key))
    assert answer.choices[0].message.content
    assert fake_upstream.requests[-1].credential == UP_KEY

    revoked = await cli(tmp_path, "revoke", made["id"])
    assert revoked["status"] == "revoked"
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        await ask(gw.openai(key))
    listed = {k["id"]: k["status"] for k in await cli(tmp_path, "list")}
    assert listed == {made["id"]: "revoked", expired["id"]: "expired"}


async def test_an_admin_revocation_applies_at_once_despite_the_cache(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    bus_url: str,
) -> None:
    config = one_model(tmp_path, fake_upstream, auth_cache_seconds=3600)
    gw = await gateway_factory(config)
    (key,) = await create_keys(tmp_path, "free")
    other = await gateway_factory(config, role="ingress") if bus_url.startswith("nats") else None
    ingresses = [gw] if other is None else [gw, other]
    for ingress in ingresses:
        await ask(ingress.openai(key))  # now cached on every ingress
    listing = (await admin_http(gw).get("/admin/keys")).json()["data"]
    (row,) = listing
    assert "key" not in row and "key_hash" not in row
    async with watch(ingresses[-1], subjects.AUTH_KEYS_CHANGED) as announced:
        resp = await admin_http(gw).post(f"/admin/keys/{row['id']}/revoke")
        assert resp.status_code == 200 and resp.json()["status"] == "revoked"
        await announced.next(ApiKeyRevoked)
    for ingress in ingresses:  # the revoking ingress dropped it; the event reached the others
        with pytest.raises(openai.AuthenticationError):
            await ask(ingress.openai(key))


async def test_a_cli_revocation_while_a_gateway_runs_goes_through_the_owner_at_once(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # ``llmgw keys`` finds the running gateway (its local socket beside the database) and
    # sends the owner an admin command: the owner announces the change, so an hour-long
    # cache drops the key at once, on inproc:// as on NATS.
    gw = await gateway_factory(one_model(tmp_path, fake_upstream, auth_cache_seconds=3600))
    made = await cli(tmp_path, "create", "--org", "o", "--user", "u", "--role", "free")
    await ask(gw.openai(made["key"]))  # cached for an hour
    async with watch(gw, subjects.event("admin")) as audit:
        await cli(tmp_path, "revoke", made["id"])
        executed = await audit.next(AdminExecuted)
    assert (executed.area, executed.verb, executed.by) == ("api_keys", "revoke", "local-cli")
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        await ask(gw.openai(made["key"]))


async def test_messages_surface_takes_x_api_key_and_refuses_in_the_anthropic_shape(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    message = {"model": "m", "max_tokens": 16, "messages": HI}
    answer = await gw.anthropic(api_key=key).messages.create(**message)  # sends x-api-key
    assert answer.content[0].text
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await gw.anthropic(api_key="llmgw-wrong").messages.create(**message)
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


async def test_a_request_with_two_keys_is_refused_in_its_shape_whichever_comes_first(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # A proxy in front that checked one of two credential headers, the gateway taking the
    # other: neither is taken. (The last one used to win, a valid key behind a wrong one.)
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    http = gw.http()
    chat = {"model": "m", "messages": HI}
    message = {"model": "m", "max_tokens": 16, "messages": HI}
    sent_before = len(fake_upstream.requests)

    answers = [
        await http.post("/v1/chat/completions", json=chat, headers=pair)
        for pair in (
            [("authorization", f"Bearer {key}"), ("authorization", "Bearer llmgw-wrong")],
            [("authorization", "Bearer llmgw-wrong"), ("Authorization", f"Bearer {key}")],
        )
    ]
    anthropic_answer = await http.post(
        "/v1/messages",
        json=message,
        headers=[("x-api-key", "llmgw-wrong"), ("x-api-key", key)],
    )
    admin_answer = await http.get(
        "/admin/keys",
        headers=[("authorization", f"Bearer {ADMIN}"), ("authorization", f"Bearer {key}")],
    )

    for answer in (*answers, admin_answer):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert "more than one authorization header" in answer.json()["error"]["message"]
    assert anthropic_answer.status_code == 400, anthropic_answer.text
    assert anthropic_answer.json()["type"] == "error"
    assert "more than one x-api-key header" in anthropic_answer.json()["error"]["message"]
    assert len(fake_upstream.requests) == sent_before
    assert (await ask(gw.openai(key))).choices[0].message.content  # one key still serves


async def test_required_role_hides_a_model_from_lower_roles(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    free_key, pro_key = await create_keys(tmp_path, "free", "pro")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(fake_upstream)),
            model("premium", route(fake_upstream), required_role="pro"),
        )
    )
    free, pro = gw.openai(free_key), gw.openai(pro_key)
    assert [m.id for m in (await free.models.list()).data if m.id[:4] != "auto"] == ["m"]
    assert [m.id for m in (await pro.models.list()).data if m.id[:4] != "auto"] == ["m", "premium"]
    with pytest.raises(openai.NotFoundError) as hidden:
        await ask(free, "premium")
    with pytest.raises(openai.NotFoundError) as unknown:
        await ask(free, "no-such-model")
    # Word for word the answer for a model that does not exist: nothing is revealed.
    assert str(hidden.value).replace("premium", "X") == str(unknown.value).replace(
        "no-such-model", "X"
    )
    assert (await ask(pro, "premium")).choices[0].message.content


async def test_admin_surfaces_need_an_admin_key_and_only_admins_see_base_urls_and_credentials(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    pro_key, admin_key = await create_keys(tmp_path, "pro", "admin")
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    assert (await gw.http().get("/admin/keys")).status_code == 401
    pro = gw.http(headers={"authorization": f"Bearer {pro_key}"})
    assert (await pro.get("/admin/keys")).status_code == 403
    assert (await pro.get("/admin/provider-keys")).status_code == 403
    admin = gw.http(headers={"authorization": f"Bearer {admin_key}"})
    assert len((await admin.get("/admin/keys")).json()["data"]) == 2

    made = await admin.post(
        "/admin/keys", json={"org": "acme", "user": "new", "role": "free", "expires_in": "1d"}
    )
    assert made.status_code == 201, made.text
    await ask(gw.openai(made.json()["key"]))  # usable at once

    endpoint = eid("m", fake_upstream)
    for path in ("/routing", "/health/deep"):
        seen = (await pro.get(path)).text
        assert endpoint in seen and fake_upstream.base_url not in seen
        assert credential_id(UP_KEY) not in seen
        shown = (await admin.get(path)).text
        assert fake_upstream.openai_base_url in shown and credential_id(UP_KEY) in shown
        assert UP_KEY not in shown


async def test_auth_required_closes_v1_without_any_key_and_the_bootstrap_key_is_admin(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(one_model(tmp_path, fake_upstream, auth="required"))
    with pytest.raises(openai.AuthenticationError):
        await ask(gw.openai("whatever"))
    await ask(gw.openai(ADMIN))
    assert (await admin_http(gw).get("/admin/keys")).status_code == 200


async def test_the_affinity_key_is_the_callers_api_key_hash(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    (key,) = await create_keys(tmp_path, "pro")
    gw = await gateway_factory(one_model(tmp_path, fake_upstream))
    async with watch(gw, subjects.observation(eid("m", fake_upstream))) as observed:
        await ask(gw.openai(key))
        obs = await observed.next(Observation)
    assert obs.caller == "key:" + hashlib.sha256(key.encode()).hexdigest()
    assert obs.role == "pro" and obs.credential_id == credential_id(UP_KEY)


async def test_keys_provider_keys_and_reservations_survive_a_restart(
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    bus_url: str,
) -> None:
    up = await fake_upstreams("up")
    config = keys_config(tmp_path, model("m", route(up, api_keys=[UP_KEY])))
    kept, dropped = await create_keys(tmp_path, "free", "free")
    gw = await start_gateway(config, bus_url)
    try:
        await ask(gw.openai(kept))
        admin = admin_http(gw)
        added = await admin.post(
            "/admin/provider-keys",
            json={"key": "sk-from-the-database", "base_url": up.openai_base_url},
        )
        assert added.status_code == 201
        await admin.post(
            "/admin/provider-keys/min-role-env", json={"key": UP_KEY, "min_role": "pro"}
        )
        revoke = next(
            k
            for k in (await admin.get("/admin/keys")).json()["data"]
            if dropped.startswith(k["prefix"])
        )
        await admin.post(f"/admin/keys/{revoke['id']}/revoke")
    finally:
        await gw.stop()

    gw = await start_gateway(config, bus_url)
    try:
        await ask(gw.openai(kept))
        assert up.requests[-1].credential == "sk-from-the-database"  # UP_KEY is pro-only now
        with pytest.raises(openai.AuthenticationError, match="revoked"):
            await ask(gw.openai(dropped))
        keys = (await pool_state(gw, eid("m", up))).keys
        assert [(k.credential_id, k.min_role, k.source) for k in keys] == [
            (credential_id(UP_KEY), "pro", "config"),
            (credential_id("sk-from-the-database"), "free", "database"),
        ]
    finally:
        await gw.stop()


@pytest.mark.nats
async def test_a_cli_revocation_is_announced_on_a_nats_bus_so_caches_drop_it_at_once(
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    nats_url: str,
) -> None:
    config = one_model(tmp_path, fake_upstream, auth_cache_seconds=3600, bus={"url": nats_url})
    config_file = tmp_path / "gateway.yaml"
    await anyio.Path(config_file).write_text(yaml.safe_dump(config))
    made = await cli(
        tmp_path, "create", "--org", "o", "--user", "u", "--role", "free", config_file=config_file
    )
    gw = await start_gateway(config, nats_url)
    try:
        await ask(gw.openai(made["key"]))  # cached for an hour
        async with watch(gw, subjects.AUTH_KEYS_CHANGED) as announced:
            await cli(tmp_path, "revoke", made["id"], config_file=config_file)
            await announced.next(ApiKeyRevoked)
        with pytest.raises(openai.AuthenticationError, match="revoked"):
            await ask(gw.openai(made["key"]))
    finally:
        await gw.stop()
