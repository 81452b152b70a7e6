"""KeyPoolActor and KeyRegistryActor on the in-process bus, with the ModelActors reading them:
observations mute keys, plans name credentials from the view, refusals are marked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import build_tree
from actors.keypool import effective_declaration
from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore
from bus import InProcessBus, Subscription
from schemas import (
    AdminCommand,
    AdminReply,
    KeyAcquire,
    KeyDeclarations,
    KeyGrant,
    KeyMuted,
    KeyPoolState,
    KeyPoolStateRequest,
    KeyUnmuted,
    Observation,
    ProbeDue,
    ProbeResult,
    ProviderKeyDecl,
    RoutePlan,
    RouteRequest,
    raise_for_reply,
    subjects,
)
from schemas.config import GatewayConfig, credential_id
from tests.unit.actors import WAIT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

A, B, P = "sk-a", "sk-b", "sk-pro"
EID = "m:local-9001"


def config(tmp_path: Path, **pool: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "database": {"path": str(tmp_path / "gw.sqlite3")},
            "routing": {
                "key_pool": {"mute_seconds": 60, **pool},
                "circuit": {"failure_threshold": 100},
            },
            "models": [
                {
                    "id": "m",
                    "route": [
                        {
                            "kind": "openai_compat",
                            "base_url": "http://127.0.0.1:9001/v1",
                            "api_keys": [A, B, {"key": P, "min_role": "pro"}],
                        }
                    ],
                },
                {
                    "id": "solo",
                    "route": [
                        {
                            "kind": "openai_compat",
                            "base_url": "http://127.0.0.1:9002/v1",
                            "api_keys": [{"key": P, "min_role": "free"}],
                        }
                    ],
                },
            ],
        }
    )


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    b = InProcessBus()
    yield b
    await b.aclose()


async def plan(bus: InProcessBus, model: str, caller: str, role: str | None) -> RoutePlan:
    reply = await bus.request(
        subjects.model_route(model),
        RouteRequest(model=model, caller=caller, role=role),
        reply_type=RoutePlan,
        timeout=WAIT,
    )
    return raise_for_reply(reply)


async def next_state(sub: Subscription, where: Callable[[KeyPoolState], bool]) -> KeyPoolState:
    with anyio.fail_after(WAIT):
        async for env in sub:
            if isinstance(env.message, KeyPoolState) and where(env.message):
                return env.message
    raise AssertionError("subscription ended")


def fail(cid: str, status: int | None = 500, role: str = "free") -> Observation:
    return Observation(
        endpoint=EID,
        model="m",
        outcome="failure",
        status=status,
        credential_id=cid,
        role=role,
        caller="key:x",
    )


async def test_observed_failure_mutes_the_key_and_plans_move_to_the_next(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    root = build_tree(config(tmp_path))
    await root.start(bus)
    try:
        assert (await plan(bus, "m", "c1", "free")).candidates[0].credential_id == credential_id(A)
        assert (await plan(bus, "m", "c2", "pro")).candidates[0].credential_id == credential_id(P)
        async with (
            bus.subscribe(subjects.keypool_state(EID)) as states,
            bus.subscribe(subjects.event("keypool")) as events,
        ):
            await bus.publish(subjects.observation(EID), fail(credential_id(A)))
            st = await next_state(states, lambda s: any(k.muted_until for k in s.keys))
            assert [k.credential_id for k in st.keys if k.muted_until] == [credential_id(A)]
            with anyio.fail_after(WAIT):
                async for env in events:
                    assert isinstance(env.message, KeyMuted)
                    assert env.message.seconds == pytest.approx(60, abs=1)
                    break
        assert (await plan(bus, "m", "c3", "free")).candidates[0].credential_id == credential_id(B)
    finally:
        await root.stop()


async def test_refused_route_is_marked_and_a_reservation_only_refusal_is_restricted(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    root = build_tree(config(tmp_path))
    await root.start(bus)
    try:
        # P is declared free on "solo" but pro on "m": the most restrictive declaration wins.
        got = await plan(bus, "solo", "c1", "free")
        assert got.reason == "key_pool"
        (c,) = got.candidates
        assert c.refusal == "key_pool_role_restricted" and c.credential_id == ""
        assert c.retry_after is None
        assert (await plan(bus, "solo", "c2", "pro")).candidates[0].credential_id == credential_id(
            P
        )
        grant = raise_for_reply(
            await bus.request(
                subjects.keypool_acquire(EID),
                KeyAcquire(caller="t", role="internal"),
                reply_type=KeyGrant,
                timeout=WAIT,
            )
        )
        assert grant.credential_id == credential_id(P)
    finally:
        await root.stop()


async def test_registry_reload_applies_database_keys_and_reservations_to_live_pools(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path)
    root = build_tree(cfg)
    await root.start(bus)
    store = ProviderKeyStore(LazyDb(cfg.database.path, [PROVIDER_KEYS]))
    try:
        decl = await store.add("sk-db", endpoint=EID, base_url="", min_role="free", now=1.0)
        await store.reserve(credential_id(A), "internal", 2.0)
        async with bus.subscribe(subjects.keypool_state(EID)) as states:
            reply = raise_for_reply(
                await bus.request(
                    subjects.admin("provider_keys", "reload"),
                    AdminCommand(by="test"),
                    reply_type=AdminReply,
                    timeout=WAIT,
                )
            )
            st = await next_state(
                states, lambda s: decl.credential_id in {k.credential_id for k in s.keys}
            )
        assert reply.result == {"pending_pools": []}  # answered once every pool applied it
        assert [(k.credential_id, k.min_role, k.source) for k in st.keys] == [
            (credential_id(A), "internal", "config"),
            (credential_id(B), "free", "config"),
            (credential_id(P), "pro", "config"),
            (decl.credential_id, "free", "database"),
        ]
        got = await bus.request(
            subjects.keypool_get(EID), KeyPoolStateRequest(), reply_type=KeyPoolState, timeout=WAIT
        )
        assert got == st
        # A free caller no longer sees A: the view followed the new declaration.
        assert (await plan(bus, "m", "c1", "free")).candidates[0].credential_id == credential_id(B)
    finally:
        await store.db.aclose()
        await root.stop()


def test_database_keys_join_by_endpoint_or_base_url_after_the_configured_ones() -> None:
    decls = KeyDeclarations(
        db_keys=(
            ProviderKeyDecl(key_id="1", credential_id="k-x", endpoint="other"),
            ProviderKeyDecl(
                key_id="2", credential_id="k-y", base_url="http://h/v1", min_role="pro"
            ),
            ProviderKeyDecl(key_id="3", credential_id="k-a", endpoint="p"),
        ),
        reservations={"k-a": "internal", "k-y": "free"},
    )
    assert effective_declaration("p", "http://h/v1/", (("k-a", "free"),), decls) == [
        ("k-a", "internal", "config"),
        ("k-y", "pro", "database"),
    ]


@pytest.mark.parametrize("ok", [True, False])
async def test_muted_key_is_probed_partway_and_the_probe_lifts_or_remutes_it(
    bus: InProcessBus,
    tmp_path: Path,
    ok: bool,
) -> None:
    cfg = config(tmp_path, mute_seconds=30)  # only the probe can end it within WAIT
    cfg = cfg.model_copy(
        update={
            "routing": cfg.routing.model_copy(
                update={
                    "bench": cfg.routing.bench.model_copy(update={"probe_after_fraction": 0.01})
                }
            )
        }
    )
    root = build_tree(cfg)
    await root.start(bus)
    a = credential_id(A)
    try:
        async with (
            bus.subscribe(subjects.PROBE_DUE) as dues,
            bus.subscribe(subjects.event("keypool")) as events,
        ):
            await bus.publish(subjects.observation(EID), fail(a))
            due: ProbeDue | None = None
            with anyio.fail_after(WAIT):
                async for env in dues:
                    assert isinstance(env.message, ProbeDue)
                    due = env.message
                    break
            assert due is not None
            assert (due.endpoint, due.credential_id) == (EID, a)
            await bus.publish(
                subjects.endpoint_probe_result(EID),
                ProbeResult(endpoint=EID, ok=ok, credential_id=a, detail="x"),
            )
            seen: list[object] = []
            with anyio.fail_after(WAIT):
                async for env in events:
                    seen.append(env.message)
                    if isinstance(env.message, KeyUnmuted) or (
                        isinstance(env.message, KeyMuted) and env.message.reason
                    ):
                        break
        last = seen[-1]
        if ok:
            assert isinstance(last, KeyUnmuted) and last.credential_id == a
        else:
            assert isinstance(last, KeyMuted) and last.reason == "probe failed"
    finally:
        await root.stop()


@pytest.mark.parametrize(("role", "first"), [("free", A), ("pro", P)])
async def test_pinned_plan_reaches_its_route_with_the_first_visible_key_even_when_muted(
    bus: InProcessBus,
    tmp_path: Path,
    role: str,
    first: str,
) -> None:
    root = build_tree(config(tmp_path))
    await root.start(bus)
    try:
        async with bus.subscribe(subjects.keypool_state(EID)) as states:
            for key in (A, B, P):
                await bus.publish(subjects.observation(EID), fail(credential_id(key)))
            await next_state(states, lambda s: all(k.muted_until for k in s.keys))
        # The state reached the model's mailbox before this request: its view has the mutes.
        assert (await plan(bus, "m", "c1", role)).reason == "key_pool"
        reply = await bus.request(
            subjects.model_route("m"),
            RouteRequest(model="m", caller="c1", role=role, pin=EID),
            reply_type=RoutePlan,
            timeout=WAIT,
        )
        pinned = raise_for_reply(reply)
    finally:
        await root.stop()

    (c,) = pinned.candidates
    assert pinned.pinned and c.refusal == ""
    assert c.credential_id == credential_id(first)


def solo_config(tmp_path: Path) -> GatewayConfig:
    """One route with one key that one failure mutes for 10 minutes; a 50 ms cooldown."""
    return GatewayConfig.model_validate(
        {
            "database": {"path": str(tmp_path / "gw.sqlite3")},
            "routing": {
                "key_pool": {
                    "sole_key_tolerance": 0,
                    "sole_key_backoff_seconds": 600,
                    "sole_key_backoff_max_seconds": 600,
                },
                "circuit": {"failure_threshold": 100, "cooldown_seconds": 0.05},
                "bench": {"failures": 100},
            },
            "models": [
                {
                    "id": "m",
                    "route": [
                        {
                            "kind": "openai_compat",
                            "api_key": A,
                            "base_url": "http://127.0.0.1:9001/v1",
                        }
                    ],
                }
            ],
        }
    )


async def _next_key_event(events: Subscription) -> object:
    with anyio.fail_after(WAIT):
        async for env in events:
            return env.message
    raise AssertionError("subscription ended")


async def test_sole_key_mute_is_probed_after_the_cooldown_and_a_success_unmutes_it(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    root = build_tree(solo_config(tmp_path))
    await root.start(bus)
    a = credential_id(A)
    try:
        async with (
            bus.subscribe(subjects.PROBE_DUE) as dues,
            bus.subscribe(subjects.event("keypool")) as events,
        ):
            await bus.publish(subjects.observation(EID), fail(a))
            muted = await _next_key_event(events)
            with anyio.fail_after(WAIT):
                async for env in dues:
                    due = env.message
                    break
            await bus.publish(
                subjects.endpoint_probe_result(EID),
                ProbeResult(endpoint=EID, ok=True, credential_id=a, credential_only=True),
            )
            back = await _next_key_event(events)
    finally:
        await root.stop()

    assert isinstance(muted, KeyMuted) and muted.seconds == pytest.approx(600, abs=1)
    assert isinstance(due, ProbeDue) and (due.endpoint, due.credential_id) == (EID, a)
    assert isinstance(back, KeyUnmuted) and back.credential_id == a


async def test_admin_bench_lift_also_unmutes_the_routes_keys(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    root = build_tree(solo_config(tmp_path))
    await root.start(bus)
    a = credential_id(A)
    try:
        async with bus.subscribe(subjects.event("keypool")) as events:
            await bus.publish(subjects.observation(EID), fail(a))
            await _next_key_event(events)
            raise_for_reply(
                await bus.request(
                    subjects.admin("bench", "lift"),
                    AdminCommand(by="test", args={"endpoint": EID}),
                    reply_type=AdminReply,
                    timeout=WAIT,
                )
            )
            back = await _next_key_event(events)
        assert (await plan(bus, "m", "c1", "free")).candidates[0].credential_id == a
    finally:
        await root.stop()

    assert isinstance(back, KeyUnmuted) and back.credential_id == a
