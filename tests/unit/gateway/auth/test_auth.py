"""Gateway API keys: the SQLite store, its owner actor, and the ingress's auth gate (cache,
modes, roles), which reaches the keys only over the bus."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import ChildSpec, Supervisor
from actors.apikey_admin import ApiKeyAdminActor
from actors.stores.api_keys import (
    API_KEYS,
    ApiKeyStore,
    parse_duration,
    parse_instant,
)
from actors.stores.provider_keys import LazyDb
from bus import InProcessBus, encode
from gateway.admin.http import admin_request
from gateway.auth.gate import ANONYMOUS, Authenticator, caller_of, may_call
from gateway.http.request import HttpRequest
from schemas import (
    ApiKeyInfo,
    ApiKeyLookup,
    ApiKeyRevoked,
    AuthState,
    AuthStateRequest,
    ForbiddenError,
    NoRespondersError,
    UnauthorizedError,
    subjects,
)
from schemas.config import GatewayConfig, ModelConfig
from schemas.keys import hash_key, parse_since

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ApiKeyStore]:
    """The keys' table, written directly by tests (as ``llmgw keys`` does with no gateway)."""
    s = ApiKeyStore(LazyDb(str(tmp_path / "keys.sqlite3"), [API_KEYS]))
    yield s
    await s.db.aclose()


@pytest.fixture
async def owner(tmp_path: Path) -> AsyncIterator[InProcessBus]:
    """A bus with the keys' owner (ApiKeyAdminActor) running on the same file."""
    bus = InProcessBus()
    root = Supervisor(
        "test",
        children=[
            ChildSpec(
                "api_keys", functools.partial(ApiKeyAdminActor, str(tmp_path / "keys.sqlite3"))
            )
        ],
    )
    await root.start(bus)
    yield bus
    await root.stop()
    await bus.aclose()


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


def auth(bus: InProcessBus, **config: Any) -> Authenticator:
    """An ingress's gate on the owner's bus."""
    return Authenticator(bus, GatewayConfig.model_validate(config))


async def test_store_keeps_only_the_hash_and_finds_the_key_by_it(
    store: ApiKeyStore,
    tmp_path: Path,
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


@pytest.mark.parametrize("since", ["1e20", "nan", "-1e300"])
def test_a_since_of_epoch_seconds_out_of_range_says_so(since: str) -> None:
    with pytest.raises(ValueError, match="between the years 1 and 9999"):
        parse_since(since, 1.7e9)


async def test_gate_is_open_without_keys_and_closes_once_one_exists(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=0)
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


async def test_gate_required_mode_and_expired_and_revoked_keys(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth="required", auth_cache_seconds=0)
    with pytest.raises(UnauthorizedError):
        await gate.gate(request("/v1/models"))
    old, _ = await store.create(org="o", user="u", role="free", now=1.0, expires=2.0)
    with pytest.raises(UnauthorizedError, match="expired"):
        await gate.gate(request("/v1/models", old))
    key, rec = await store.create(org="o", user="u", role="free", now=1.0)
    await store.revoke(rec.id, 3.0)
    with pytest.raises(UnauthorizedError, match="revoked"):
        await gate.gate(request("/v1/models", key))


async def test_cached_key_stays_valid_until_forgotten(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=3600)
    key, rec = await store.create(org="o", user="u", role="free", now=1.0)
    await gate.gate(request("/v1/models", key))
    await store.revoke(rec.id, 2.0)
    await gate.gate(request("/v1/models", key))  # served from the cache
    gate.forget(rec.key_hash)  # what an ApiKeyRevoked event does
    with pytest.raises(UnauthorizedError, match="revoked"):
        await gate.gate(request("/v1/models", key))


async def test_forgetting_a_key_by_its_id_drops_only_that_cached_entry(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=3600)
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


async def test_admin_paths_need_an_admin_key(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, admin_key="boot-admin", auth_cache_seconds=0)
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
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=0)
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


async def test_bootstrap_admin_key_alone_does_not_close_v1(
    store: ApiKeyStore,
    owner: InProcessBus,
) -> None:
    gate = auth(owner, admin_key="boot-admin", auth_cache_seconds=0)
    req = request("/v1/models")
    await gate.gate(req)
    assert caller_of(req) == ANONYMOUS


def test_required_role_hides_a_model_from_lower_roles() -> None:
    premium = ModelConfig(id="p", required_role="pro")
    req = request("/v1/models")
    assert not may_call(req, premium)
    assert may_call(req, ModelConfig(id="open"))


async def _admin(bus: InProcessBus, verb: str, **args: Any) -> dict[str, Any]:
    return await admin_request(bus, "api_keys", verb, args, by="test", timeout=5.0)


async def test_owner_announces_the_first_key_so_a_long_cached_open_gate_closes_at_once(
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=3600)
    await gate.start()
    try:
        await gate.gate(request("/v1/models"))  # open: no key yet, answer cached for an hour
        state = await owner.request(
            subjects.AUTH_STATE_GET, AuthStateRequest(), reply_type=AuthState, timeout=5.0
        )
        assert state == AuthState(any_keys=False)
        async with owner.subscribe(subjects.AUTH_STATE) as states:
            made = await _admin(owner, "create", org="o", user="u", role="pro")
            with anyio.fail_after(5.0):
                async for env in states:
                    assert env.message == AuthState(any_keys=True)
                    break
        with pytest.raises(UnauthorizedError, match="missing API key"):
            await gate.gate(request("/v1/models"))
        ok = request("/v1/models", str(made["key"]))
        await gate.gate(ok)
        assert caller_of(ok).key_id == made["id"] and caller_of(ok).org == "o"
    finally:
        await gate.aclose()


async def test_callers_arriving_while_auth_state_is_stale_share_one_question(
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=3600)
    async with owner.subscribe(subjects.AUTH_STATE_GET) as questions:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(gate.gate, request("/v1/models", "sk-unknown"))
        assert questions.pending == 1
    await gate.aclose()


async def test_once_auth_is_known_off_its_recheck_keeps_no_caller_waiting() -> None:
    # The owner answered once, then went silent (the bus down): an anonymous caller goes on
    # with what is known rather than wait out the decision timeout before routing's own.
    bus = InProcessBus()
    now = [0.0]
    gate = Authenticator(bus, GatewayConfig.model_validate({}), clock=lambda: now[0])
    async with bus.subscribe(subjects.AUTH_STATE_GET) as questions:
        async with anyio.create_task_group() as tg:
            tg.start_soon(gate.gate, request("/v1/models"))
            async for env in questions:
                await env.respond(AuthState(any_keys=False))
                break
        now[0] += 3600.0
        with anyio.fail_after(2.0):  # the decision timeout is 5 s
            await gate.gate(anonymous := request("/v1/models"))
        assert caller_of(anonymous) == ANONYMOUS
        assert questions.pending == 1  # the recheck is asked all the same
    await gate.aclose()
    await bus.aclose()


async def test_a_revocation_through_the_owner_drops_the_cached_key_at_once(
    owner: InProcessBus,
) -> None:
    gate = auth(owner, auth_cache_seconds=3600)
    await gate.start()
    try:
        made = await _admin(owner, "create", org="o", user="u", role="free")
        key = str(made["key"])
        await gate.gate(request("/v1/models", key))  # cached as active for an hour
        async with owner.subscribe(subjects.AUTH_KEYS_CHANGED) as changes:
            await _admin(owner, "revoke", id=made["id"])
            with anyio.fail_after(5.0):
                async for env in changes:
                    assert env.message == ApiKeyRevoked(key_hash=hash_key(key))
                    break
        # The gate's own follower saw the same event: the next lookup asks the owner again.
        # (Awaiting it: a request round trip on the same bus runs after the event's delivery.)
        await owner.request(
            subjects.AUTH_STATE_GET, AuthStateRequest(), reply_type=AuthState, timeout=5.0
        )
        with pytest.raises(UnauthorizedError, match="revoked"):
            await gate.gate(request("/v1/models", key))
    finally:
        await gate.aclose()


async def test_unknown_keys_are_cached_too_and_the_answer_never_carries_the_key(
    owner: InProcessBus,
    store: ApiKeyStore,
) -> None:
    key, _ = await store.create(org="o", user="u", role="free", now=1.0)
    gate = auth(owner, auth_cache_seconds=3600)
    async with owner.subscribe(subjects.AUTH_KEYS_LOOKUP) as asked:
        for _ in range(3):
            with pytest.raises(UnauthorizedError, match="invalid API key"):
                await gate.gate(request("/v1/models", "llmgw-not-a-key"))
        await gate.gate(request("/v1/models", key))
        seen = []
        with anyio.fail_after(5.0):
            async for env in asked:
                seen.append(env.message)
                if len(seen) == 2:
                    break
    assert seen == [
        ApiKeyLookup(key_hash=hash_key("llmgw-not-a-key")),
        ApiKeyLookup(key_hash=hash_key(key)),
    ]
    reply = await owner.request(
        subjects.AUTH_KEYS_LOOKUP,
        ApiKeyLookup(key_hash=hash_key(key)),
        reply_type=ApiKeyInfo,
        timeout=5.0,
    )
    assert isinstance(reply, ApiKeyInfo) and reply.found
    wire = encode(reply)
    assert key.encode() not in wire and hash_key(key).encode() not in wire


async def test_without_the_owner_the_gate_refuses_rather_than_opening() -> None:
    bus = InProcessBus()
    try:
        gate = auth(bus)
        await gate.start()  # logs "undecided"; does not raise
        with pytest.raises(NoRespondersError):
            await gate.gate(request("/v1/models"))
        with pytest.raises(NoRespondersError):
            await gate.gate(request("/v1/models", "llmgw-whatever"))
        await gate.aclose()
    finally:
        await bus.aclose()


async def test_admin_of_hash_holds_only_while_the_admin_key_is_active(
    owner: InProcessBus,
    store: ApiKeyStore,
) -> None:
    # What a dashboard session checks on every request: its key, by hash, through the cache.
    key, rec = await store.create(org="o", user="ann", role="admin", now=1.0)
    expired, _ = await store.create(org="o", user="bob", role="admin", now=1.0, expires=2.0)
    pro, _ = await store.create(org="o", user="cid", role="pro", now=1.0)
    gate = auth(owner)
    caller = await gate.admin_of_hash(hash_key(key))
    assert caller is not None and (caller.key_id, caller.role) == (rec.id, "admin")
    assert await gate.admin_of_hash(hash_key(expired)) is None
    assert await gate.admin_of_hash(hash_key(pro)) is None
    assert await gate.admin_of_hash(hash_key("llmgw-unknown")) is None
    await store.revoke(rec.id, now=3.0)
    gate.forget(rec.key_hash)  # what the revocation event does
    assert await gate.admin_of_hash(hash_key(key)) is None
