"""No secret ever leaves the gateway except towards its upstream: a run with successes,
key-specific failures (one upstream echoing the key it was sent), mutes, exhaustion, admin
changes and bad gateway keys, with every log line (DEBUG) and every bus message captured,
contains no upstream key and no gateway API key in clear; nor does an Azure Entra ID token an
upstream echoes bare. The one exception is by design: the
admin command that adds a provider key carries it to the KeyRegistryActor on the admin-only
subject ``llmgw.admin.provider_keys.add``. Runs on ``inproc://`` and NATS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import msgspec
import openai
import pytest

from schemas import KeyCooling, KeyMuted, Observation, subjects
from tests.e2e.conftest import HI, config, eid, gateway_bus, model, route, watch
from tests.e2e.keys_support import ADMIN, admin_http, create_keys, keys_config
from tests.fixtures.upstream import Reply, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

A, B, D = "sk-secret-config-aaaa", "sk-secret-config-bbbb", "sk-secret-database-dddd"
TOKEN = "eyJ0eXAiOiJKV1Qi.entra-token-cccc"


async def test_no_log_line_event_or_answer_carries_a_key_in_clear(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    up = await fake_upstreams("up")
    user_key, admin_key = await create_keys(tmp_path, "free", "admin")
    gw = await gateway_factory(
        keys_config(
            tmp_path, model("m", route(up, api_keys=[A, B])), key_pool={"sole_key_tolerance": 0}
        )
    )
    events: list[tuple[str, bytes]] = []
    answers: list[str] = []

    async def record() -> None:
        async with gateway_bus(gw).subscribe("llmgw.>") as sub:
            async for env in sub:
                events.append((env.subject, msgspec.json.encode(env.message)))

    recorder = asyncio.create_task(record())
    client = gw.openai(user_key)
    admin = admin_http(gw)
    try:
        await client.chat.completions.create(model="m", messages=HI)
        async with watch(gw, subjects.event("keypool")) as keypool:
            up.enqueue(Reply(401, body={"error": {"message": f"Incorrect API key: {A}"}}))
            served = await client.chat.completions.create(model="m", messages=HI)
            answers.append(served.model_dump_json())  # A refused: served at once on B
            await keypool.next(KeyMuted)
            stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
            answers.append(str([chunk async for chunk in stream]))
            echo = '{"error": {"message": "Rate limit reached for key {credential}"}}'
            up.enqueue(
                Reply(
                    429, body=echo, headers={"Retry-After": "5", "content-type": "application/json"}
                )
            )
            with pytest.raises(openai.RateLimitError) as limited:
                await client.chat.completions.create(model="m", messages=HI)
            answers.append(limited.value.response.text)
            await keypool.next(KeyCooling)  # a rate limit cools the last key, no mute
        with pytest.raises(openai.APIStatusError) as exhausted:
            await client.chat.completions.create(model="m", messages=HI)
        answers.append(exhausted.value.response.text)

        for call in (
            admin.post("/admin/provider-keys", json={"key": D, "endpoint": eid("m", up)}),
            admin.post("/admin/provider-keys/min-role-env", json={"key": A, "min_role": "pro"}),
            admin.get("/admin/provider-keys"),
            admin.get("/admin/keys"),
            admin.get("/routing"),
            admin.get("/health/deep"),
        ):
            answers.append((await call).text)
        await client.chat.completions.create(model="m", messages=HI)
        assert up.requests[-1].credential == D
        made = await admin.post("/admin/keys", json={"org": "o", "user": "u", "role": "pro"})
        minted = made.json()["key"]  # the one answer allowed to show a key: its creation
        await gw.openai(minted).chat.completions.create(model="m", messages=HI)
        answers.append((await admin.delete(f"/admin/keys/{made.json()['id']}")).text)
        for bad in (minted, "llmgw-not-a-real-key", admin_key + "x"):
            with pytest.raises(openai.AuthenticationError) as refused:
                await gw.openai(bad).chat.completions.create(model="m", messages=HI)
            answers.append(refused.value.response.text)
    finally:
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder

    assert len(events) > 20 and len(caplog.records) > 20
    logged = caplog.text + "\n".join(_args(r) for r in caplog.records)
    for secret in (A, B, D, user_key, admin_key, minted, ADMIN):
        assert secret not in logged, f"a log line carries {secret[:8]}..."
        carried = {subject for subject, e in events if secret.encode() in e}
        allowed = {subjects.admin("provider_keys", "add")} if secret == D else set()
        assert carried == allowed, f"{carried} carry {secret[:8]}..."
        assert not any(secret in a for a in answers), f"an answer carries {secret[:8]}..."
    assert "[redacted]" in limited.value.response.text


async def test_entra_token_an_azure_upstream_echoes_bare_is_redacted_everywhere(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    up = await fake_upstreams("az")
    azure = {"deployment": "d", "entra_token_command": [sys.executable, "-c", f"print({TOKEN!r})"]}
    azure_route = {"kind": "azure_openai", "base_url": up.azure_base_url, "azure": azure}
    gw = await gateway_factory(config(model("m", {**azure_route, "provider_model_id": "d"})))
    # Azure's 401 names the token it refused, bare (no "Bearer" before it).
    echo = '{"error": {"code": "401", "message": "Access denied: token {credential} expired"}}'
    up.enqueue(Reply(401, body=echo, headers={"content-type": "application/json"}))

    async with watch(gw, "llmgw.>") as seen:
        with pytest.raises(openai.APIStatusError) as refused:
            await gw.openai().chat.completions.create(model="m", messages=HI)
        await seen.next(Observation, lambda o: o.endpoint == eid("m", up))

    assert up.requests[0].credential == TOKEN  # the fake did echo what it was sent
    answer = refused.value.response.text
    assert "Access denied: token [redacted] expired" in answer
    logged = caplog.text + "\n".join(_args(r) for r in caplog.records)
    events = b"".join(msgspec.json.encode(m) for m in seen.seen)
    assert TOKEN not in answer and TOKEN not in logged and TOKEN.encode() not in events


def _args(record: logging.LogRecord) -> str:
    """A record's raw arguments too (a formatter could print what the message omits)."""
    args: Any = record.args
    return repr(args) if args else ""
