"""Keys as admin commands on the bus: ``llmgw.admin.provider_keys.<verb>`` answered by the
KeyRegistryActor and ``llmgw.admin.api_keys.<verb>`` answered by the ApiKeyAdminActor, sent
the way ``llmgw admin`` sends them (and, on NATS, by the CLI from another process); traffic
through the real server with the openai SDK shows each change applied once it is answered.
Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import openai
import pytest
import yaml

from gateway.admin.http import admin_request
from schemas import (
    AdminExecuted,
    ApiKeyCreated,
    ApiKeyRevoked,
    InvalidRequestError,
    RouteNotFoundError,
    subjects,
)
from schemas.config import credential_id
from tests.e2e.conftest import WAIT, eid, gateway_bus, model, route, watch
from tests.e2e.keys_support import ask, create_keys, keys_config, pool_state, spent
from tests.fixtures.gateway import REPO, GatewayFactory, GatewayProcess, RunningGateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

A, D = "sk-upstream-config-aaaa", "sk-upstream-database-dddd"


async def command(gw: RunningGateway, area: str, verb: str, **args: Any) -> dict[str, Any]:
    return await admin_request(gateway_bus(gw), area, verb, args, by="test", timeout=WAIT)


async def test_provider_key_commands_apply_to_live_pools_before_they_are_answered(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    (free_key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, api_keys=[A]))))
    free, pool = gw.openai(free_key), eid("m", up)

    async with watch(gw, subjects.event("admin")) as audit:
        added = await command(gw, "provider_keys", "add", key=D, endpoint=pool)
        executed = await audit.next(AdminExecuted)
    assert (executed.area, executed.verb, executed.by, executed.ok) == (
        "provider_keys",
        "add",
        "test",
        True,
    )
    assert added["pending_pools"] == [] and added["credential_id"] == credential_id(D)
    assert D not in json.dumps(added)
    # Answered only once applied: the pool's owner already declares the key.
    assert [(k.credential_id, k.source) for k in (await pool_state(gw, pool)).keys] == [
        (credential_id(A), "config"),
        (credential_id(D), "database"),
    ]

    reserved = await command(
        gw, "provider_keys", "reserve", credential_id=credential_id(A), min_role="pro"
    )
    assert reserved["pending_pools"] == []
    await ask(free)
    assert spent(up) == D  # A is reserved for pro and above now

    listing = await command(gw, "provider_keys", "list")
    assert [(k["id"], k["effective_min_role"]) for k in listing["database"]] == [
        (added["id"], "free")
    ]
    assert listing["reservations"] == [
        {"credential_id": credential_id(A), "min_role": "pro", "configured": True}
    ]

    raised = await command(gw, "provider_keys", "set_min_role", id=added["id"], min_role="internal")
    assert raised["min_role"] == "internal"
    with pytest.raises(openai.PermissionDeniedError):
        await ask(free)  # both keys are reserved above free

    await command(gw, "provider_keys", "delete", id=added["id"])
    await command(gw, "provider_keys", "reserve", key=A, min_role="free")  # lifts it
    assert [k.credential_id for k in (await pool_state(gw, pool)).keys] == [credential_id(A)]
    await ask(free)
    assert spent(up) == A


async def test_provider_key_commands_are_refused_clearly_and_change_nothing(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, api_keys=[A]))))
    pool = eid("m", up)

    async with watch(gw, subjects.event("admin")) as audit:
        with pytest.raises(InvalidRequestError) as bad_role:
            await command(gw, "provider_keys", "add", key=D, endpoint=pool, min_role="boss")
        refused = await audit.next(AdminExecuted)
    with pytest.raises(InvalidRequestError) as no_route:
        await command(gw, "provider_keys", "add", key=D, endpoint="m:nowhere")
    with pytest.raises(InvalidRequestError) as both:
        await command(gw, "provider_keys", "add", key=D, endpoint=pool, base_url=up.base_url)
    with pytest.raises(RouteNotFoundError):
        await command(gw, "provider_keys", "set_min_role", id="pk-missing", min_role="pro")
    with pytest.raises(RouteNotFoundError):
        await command(gw, "provider_keys", "delete", id="pk-missing")
    with pytest.raises(InvalidRequestError) as unknown:
        await command(gw, "provider_keys", "rotate")

    assert (bad_role.value.param, no_route.value.param, both.value.param) == (
        "min_role",
        "endpoint",
        "endpoint",
    )
    assert (refused.verb, refused.ok) == ("add", False) and "min_role" in refused.message
    assert "known: add, delete, list, reload, reserve, set_min_role" in unknown.value.message
    assert D not in str(bad_role.value) + refused.message
    assert [k.credential_id for k in (await pool_state(gw, pool)).keys] == [credential_id(A)]
    assert (await command(gw, "provider_keys", "list"))["database"] == []


async def test_gateway_api_key_commands_create_list_and_revoke(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up)), auth="required"))

    async with watch(gw, subjects.AUTH_KEYS_CHANGED) as announced:
        made = await command(
            gw, "api_keys", "create", org="acme", user="ada", role="pro", name="ci", expires_in="1h"
        )
        created = await announced.next(ApiKeyCreated)
        await ask(gw.openai(made["key"]))
        listing = await command(gw, "api_keys", "list")
        revoked = await command(gw, "api_keys", "revoke", id=made["id"])
        gone = await announced.next(ApiKeyRevoked)
    with pytest.raises(openai.AuthenticationError):
        await ask(gw.openai(made["key"]))
    with pytest.raises(InvalidRequestError) as bad:
        await command(gw, "api_keys", "create", org="acme", user="ada", role="owner")
    with pytest.raises(RouteNotFoundError):
        await command(gw, "api_keys", "revoke", id="gk-missing")

    assert made["key"].startswith("llmgw-") and (made["org"], made["role"]) == ("acme", "pro")
    assert created.key_hash == gone.key_hash
    (row,) = listing["data"]
    assert row["id"] == made["id"] and row["status"] == "active"
    assert made["key"] not in json.dumps(listing) and created.key_hash not in json.dumps(listing)
    assert revoked["status"] == "revoked"
    assert bad.value.param == "role"


@pytest.mark.nats
async def test_llmgw_admin_manages_keys_over_nats_from_another_process(
    fake_upstream: FakeUpstream,
    nats_url: str,
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            keys_config(tmp_path, model("m", route(fake_upstream, api_keys=[A])), auth="required")
        )
    )
    proc = GatewayProcess(["serve", "--config", str(cfg), "--port", "0", "--bus", nats_url])
    await asyncio.to_thread(proc.start)
    try:
        added = await asyncio.to_thread(
            _llmgw_admin,
            nats_url,
            "provider_keys",
            "add",
            f"key={D}",
            f"endpoint={eid('m', fake_upstream)}",
        )
        reserved = await asyncio.to_thread(
            _llmgw_admin, nats_url, "provider_keys", "reserve", f"key={A}", "min_role=admin"
        )
        made = await asyncio.to_thread(
            _llmgw_admin, nats_url, "api_keys", "create", "org=acme", "user=ops", "role=free"
        )
        async with openai.AsyncOpenAI(
            base_url=f"{proc.url}/v1", api_key=made["key"], max_retries=0
        ) as client:
            await ask(client)
    finally:
        await asyncio.to_thread(proc.stop)

    assert added["credential_id"] == credential_id(D) and added["pending_pools"] == []
    assert reserved["credential_id"] == credential_id(A)
    assert spent(fake_upstream) == D  # the CLI's key, by the CLI's reservation


def _llmgw_admin(bus: str, area: str, verb: str, *args: str) -> Any:
    argv = [sys.executable, "-m", "gateway.cli.main", "admin", area, verb, "--bus", bus]
    for arg in args:
        argv += ["--arg", arg]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
