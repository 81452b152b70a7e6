"""Gateway API keys: the SQLite store, and the ingress's auth gate (cache, modes, roles)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.apikeys import (
    API_KEYS,
    ApiKeyStore,
    hash_key,
    parse_duration,
    parse_instant,
)
from actors.keystore import LazyDb
from bus import InProcessBus
from gateway.auth import ANONYMOUS, Authenticator, caller_of, may_call
from gateway.http import HttpRequest
from schemas import ForbiddenError, UnauthorizedError
from schemas.config import GatewayConfig, ModelConfig


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ApiKeyStore]:
    s = ApiKeyStore(LazyDb(str(tmp_path / "keys.sqlite3"), [API_KEYS]))
    yield s
    await s.db.aclose()


def request(path: str, key: str | None = None, header: str = "authorization") -> HttpRequest:
    headers = []
    if key is not None:
        value = f"Bearer {key}" if header == "authorization" else key
        headers.append((header.encode(), value.encode()))
    scope: dict[str, Any] = {"type": "http", "path": path, "method": "GET", "headers": headers}

    async def receive() -> dict[str, Any]:
        raise AssertionError("not used")

    async def send(message: Any) -> None:
        raise AssertionError("not used")

    return HttpRequest(scope, receive, send)


def auth(store: ApiKeyStore, **config: Any) -> Authenticator:
    return Authenticator(InProcessBus(), GatewayConfig.model_validate(config), store)


async def test_store_keeps_only_the_hash_and_finds_the_key_by_it(
    store: ApiKeyStore, tmp_path: Path,
) -> None:
    assert not await store.any_keys()
    key, rec = await store.create(org="acme", user="ann", role="pro", now=100.0)
    assert key.startswith("llmgw-") and len(key) > 40
    assert rec.key_hash == hash_key(key) and (rec.org, rec.user, rec.role) == ("acme", "ann", "pro")
    assert await store.lookup(hash_key(key)) == rec
    assert await store.any_keys()
    await store.db.aclose()  # checkpoint, then read the files as they are on disk
    raw = b"".join([await p.read_bytes() async for p in anyio.Path(tmp_path).iterdir()])
    assert key.encode() not in raw and rec.key_hash.encode() in raw


async def test_store_lists_expires_and_revokes(store: ApiKeyStore) -> None:
    key1, r1 = await store.create(org="acme", user="ann", role="free", now=1.0, expires=50.0)
    _, r2 = await store.create(org="acme", user="bob", role="admin", now=2.0, name="ops")
    assert [r.id for r in await store.records()] == [r1.id, r2.id]
    assert r1.status(49.0) == "active" and r1.status(50.0) == "expired"
    revoked = await store.revoke(r2.id, 10.0)
    assert revoked is not None and revoked.status(11.0) == "revoked"
    again = await store.revoke(key1, 12.0)  # by the key itself
    assert again is not None and again.revoked == 12.0
    assert await store.revoke("gk-nope", 1.0) is None
    with pytest.raises(ValueError, match="unknown role"):
        await store.create(org="acme", user="x", role="boss", now=1.0)


def test_durations_and_instants() -> None:
    assert parse_duration("90") == 90 and parse_duration("15m") == 900
    assert parse_duration(" 2h") == 7200 and parse_duration("30d") == 30 * 86400
    assert parse_instant("1970-01-01T00:01:00Z") == 60 and parse_instant(5) == 5
    for bad in ("", "-1", "abc", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)


async def test_gate_is_open_without_keys_and_closes_once_one_exists(store: ApiKeyStore) -> None:
    gate = auth(store, auth_cache_seconds=0)
    req = request("/v1/chat/completions", "sk-anything")
    await gate.gate(req)
    assert caller_of(req) == ANONYMOUS
    key, rec = await store.create(org="o", user="u", role="pro", now=1.0)
    with pytest.raises(UnauthorizedError, match="missing API key"):
        await gate.gate(request("/v1/models"))
    with pytest.raises(UnauthorizedError, match="invalid API key"):
        await gate.gate(request("/v1/models", "sk-anything"))
    ok = request("/v1/models", key, header="x-api-key")
    await gate.gate(ok)
    assert caller_of(ok).key_hash == rec.key_hash and caller_of(ok).role == "pro"


async def test_gate_required_mode_and_expired_and_revoked_keys(store: ApiKeyStore) -> None:
    gate = auth(store, auth="required", auth_cache_seconds=0)
    with pytest.raises(UnauthorizedError):
        await gate.gate(request("/v1/models"))
    old, _ = await store.create(org="o", user="u", role="free", now=1.0, expires=2.0)
    with pytest.raises(UnauthorizedError, match="expired"):
        await gate.gate(request("/v1/models", old))
    key, rec = await store.create(org="o", user="u", role="free", now=1.0)
    await store.revoke(rec.id, 3.0)
    with pytest.raises(UnauthorizedError, match="revoked"):
        await gate.gate(request("/v1/models", key))


async def test_cached_key_stays_valid_until_forgotten(store: ApiKeyStore) -> None:
    gate = auth(store, auth_cache_seconds=3600)
    key, rec = await store.create(org="o", user="u", role="free", now=1.0)
    await gate.gate(request("/v1/models", key))
    await store.revoke(rec.id, 2.0)
    await gate.gate(request("/v1/models", key))  # served from the cache
    gate.forget(rec.key_hash)  # what an ApiKeyRevoked event does
    with pytest.raises(UnauthorizedError, match="revoked"):
        await gate.gate(request("/v1/models", key))


async def test_forgetting_a_key_by_its_id_drops_only_that_cached_entry(
    store: ApiKeyStore,
) -> None:
    gate = auth(store, auth_cache_seconds=3600)
    key, rec = await store.create(org="o", user="u", role="free", now=1.0)
    other, other_rec = await store.create(org="o", user="v", role="free", now=1.0)
    for k in (key, other):
        await gate.gate(request("/v1/models", k))
    await store.revoke(rec.id, 2.0)
    await store.revoke(other_rec.id, 2.0)
    gate.forget_key_id(rec.id)  # what the ingress does after an admin revoke it sent
    with pytest.raises(UnauthorizedError, match="revoked"):
        await gate.gate(request("/v1/models", key))
    await gate.gate(request("/v1/models", other))  # still cached


async def test_admin_paths_need_an_admin_key(store: ApiKeyStore) -> None:
    gate = auth(store, admin_key="boot-admin", auth_cache_seconds=0)
    with pytest.raises(UnauthorizedError):
        await gate.gate(request("/admin/keys"))
    pro, _ = await store.create(org="o", user="u", role="pro", now=1.0)
    with pytest.raises(ForbiddenError):
        await gate.gate(request("/admin/keys", pro))
    boot = request("/admin/keys", "boot-admin")
    await gate.gate(boot)
    assert caller_of(boot).is_admin
    admin, _ = await store.create(org="o", user="root", role="admin", now=1.0)
    db_admin = request("/admin/keys", admin)
    await gate.gate(db_admin)
    assert caller_of(db_admin).is_admin
    # Elsewhere (probes) a key is identified when valid, and ignored when not.
    other = request("/health", "nonsense")
    await gate.gate(other)
    assert caller_of(other) == ANONYMOUS


async def test_introspection_paths_with_auth_on_need_a_key_and_metrics_an_internal_one(
    store: ApiKeyStore,
) -> None:
    gate = auth(store, auth_cache_seconds=0)
    pro, _ = await store.create(org="o", user="u", role="pro", now=1.0)
    internal, _ = await store.create(org="o", user="i", role="internal", now=1.0)
    for path in ("/routing", "/health/deep", "/metrics"):
        with pytest.raises(UnauthorizedError):
            await gate.gate(request(path))
        with pytest.raises(UnauthorizedError):
            await gate.gate(request(path, "nonsense"))
    for path in ("/routing", "/health/deep"):
        seen = request(path, pro)
        await gate.gate(seen)
        assert caller_of(seen).role == "pro"
    with pytest.raises(ForbiddenError):
        await gate.gate(request("/metrics", pro))
    await gate.gate(request("/metrics", internal))


async def test_bootstrap_admin_key_alone_does_not_close_v1(store: ApiKeyStore) -> None:
    gate = auth(store, admin_key="boot-admin", auth_cache_seconds=0)
    req = request("/v1/models")
    await gate.gate(req)
    assert caller_of(req) == ANONYMOUS


def test_required_role_hides_a_model_from_lower_roles() -> None:
    premium = ModelConfig(id="p", required_role="pro")
    req = request("/v1/models")
    assert not may_call(req, premium)
    assert may_call(req, ModelConfig(id="open"))
