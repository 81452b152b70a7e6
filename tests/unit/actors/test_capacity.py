"""CapacityActor and its ledger with an injected clock: leases granted until full, refused,
released, renewed, expired (and one a ModelActor asked for but heard nothing back about given
back); calendar windows in a time zone, rolling windows, token
reconciliation, persistence across a restart, and an http_json source's readings."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

import actors.capacity_view
from actors import ChildSpec, Supervisor, build_tree
from actors.capacity import CapacityActor, _FirstRefreshDue, _Sweep
from actors.capacity_view import CapacityViews
from actors.state.capacity_ledger import CapacityLedger, window_bounds
from actors.stores.snapshots import SnapshotStore
from schemas import (
    CapacityAcquire,
    CapacityGet,
    CapacityGrant,
    CapacityRelease,
    CapacityRenew,
    CapacityState,
    QuotaReading,
    QuotaSourceStatus,
    subjects,
)
from schemas.capacity import PoolSpec, capacity_pools
from schemas.config import GatewayConfig, HttpJsonQuotaSource, LeaseConfig, LocalQuotaSource
from tests.unit.actors import WAIT, FakeClock, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from actors.reconfigure import Change
    from bus import InProcessBus

NY = ZoneInfo("America/New_York")


def _concurrency(limit: int = 2) -> PoolSpec:
    return PoolSpec("slots", "concurrency", float(limit), None, ("m:a",))


def _quota(limit: float = 3, **source: object) -> PoolSpec:
    return PoolSpec(
        "q", "quota", limit, LocalQuotaSource.model_validate({"kind": "local", **source}), ("m:a",)
    )


def _at(y: int, mo: int, d: int, h: int = 0, mi: int = 0, zone: ZoneInfo = NY) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=zone).timestamp()


# -- the ledger ---------------------------------------------------------------------------


def test_concurrency_grants_until_full_then_refuses_and_a_release_frees_a_slot() -> None:
    ledger = CapacityLedger(_concurrency(2), ttl=30, now=0)
    a = ledger.acquire("ing1", "m:a", 1, 0)
    b = ledger.acquire("ing1", "m:a", 1, 0)
    refused = ledger.acquire("ing2", "m:a", 1, 0)
    assert isinstance(a, tuple) and isinstance(b, tuple)
    assert refused == "concurrency pool 'slots' is full (2/2)"
    assert ledger.release(a[0], None) is True
    assert ledger.release(a[0], None) is False  # twice is harmless
    assert isinstance(ledger.acquire("ing2", "m:a", 1, 0), tuple)
    assert ledger.state(0).used == 2


def test_a_lease_under_a_proposed_id_is_granted_once_and_given_back_by_that_id() -> None:
    ledger = CapacityLedger(_concurrency(2), ttl=30, now=0)
    first = ledger.acquire("ing1", "m:a", 1, 0, lease_id="P1")
    again = ledger.acquire("ing1", "m:a", 1, 5, lease_id="P1")  # the same ask, asked again
    assert first == again == ("P1", 30)
    assert ledger.state(5).used == 1
    assert ledger.release("P1", 0.0) is True  # its holder gave up waiting for the answer
    assert ledger.state(5).used == 0


def test_an_unrenewed_lease_expires_after_the_ttl_and_a_renewed_one_lives_on() -> None:
    ledger = CapacityLedger(_concurrency(2), ttl=30, now=0)
    kept = ledger.acquire("ing1", "m:a", 1, 0)
    lost = ledger.acquire("ing2", "m:a", 1, 0)
    assert isinstance(kept, tuple) and isinstance(lost, tuple)
    assert ledger.renew("ing1", (kept[0], lost[0]), 20) == 1  # another holder's id is ignored
    assert ledger.expire(29.9) == []
    assert [x.holder for x in ledger.expire(30)] == ["ing2"]
    assert ledger.state(30).used == 1
    assert ledger.next_deadline() == 50
    assert [x.holder for x in ledger.expire(50)] == ["ing1"]


def test_a_lease_renewed_but_never_released_expires_at_its_maximum_age() -> None:
    ledger = CapacityLedger(_concurrency(2), ttl=30, now=0, max_age=100)
    forgotten = ledger.acquire("ing1", "m:a", 1, 0)
    assert isinstance(forgotten, tuple)
    for t in (20, 40, 60, 80):
        assert ledger.renew("ing1", (forgotten[0],), t) == 1
    assert ledger.next_deadline() == 100  # not 110: the renewal at 80 stops at the max age
    assert ledger.expire(99.9) == []
    [gone] = ledger.expire(100)
    assert gone.aged_out and ledger.state(100).used == 0
    unrenewed = ledger.acquire("ing1", "m:a", 1, 100)
    assert isinstance(unrenewed, tuple)
    [lapsed] = ledger.expire(130)
    assert not lapsed.aged_out  # it lapsed unrenewed, long before its maximum age


def test_the_maximum_age_is_the_setting_else_the_longest_route_timeout_plus_a_ttl() -> None:
    assert LeaseConfig(ttl_seconds=30).max_age([600, 120]) == 630
    assert LeaseConfig(ttl_seconds=30, max_age_seconds=45).max_age([600]) == 45


def test_a_request_quota_counts_one_per_request_and_an_expired_lease_keeps_its_charge() -> None:
    ledger = CapacityLedger(_quota(2, window=3600), ttl=30, now=0)
    first = ledger.acquire("i", "m:a", 500, 0)
    assert isinstance(first, tuple)
    assert ledger.expire(30)  # the request went upstream: the unit stays spent
    assert isinstance(ledger.acquire("i", "m:a", 1, 31), tuple)
    assert ledger.acquire("i", "m:a", 1, 32) == "quota pool 'q' is spent (2/2 requests)"
    assert ledger.state(32).used == 2


def test_daily_window_resets_at_midnight_in_its_time_zone_not_utc() -> None:
    start = _at(2026, 3, 7, 23, 0)  # 04:00 UTC on the 8th: a UTC day would have reset
    ledger = CapacityLedger(_quota(1, window="daily", timezone="America/New_York"), 30, start)
    got = ledger.acquire("i", "m:a", 1, start)
    assert isinstance(got, tuple) and ledger.release(got[0], None)
    assert ledger.state(start).resets_at == _at(2026, 3, 8)
    assert "spent" in str(ledger.acquire("i", "m:a", 1, _at(2026, 3, 7, 23, 59)))
    assert ledger.next_deadline() == _at(2026, 3, 8)
    assert ledger.roll(_at(2026, 3, 8, 0, 0)) is True
    assert ledger.state(_at(2026, 3, 8)).used == 0
    # The 8th is the DST change in New York: a 23-hour day, still reset at local midnight.
    assert ledger.state(_at(2026, 3, 8)).resets_at == _at(2026, 3, 9)
    assert _at(2026, 3, 9) - _at(2026, 3, 8) == 23 * 3600


def test_hourly_and_monthly_windows_follow_the_calendar() -> None:
    now = _at(2026, 12, 31, 22, 17)
    assert window_bounds("hourly", NY, now) == (_at(2026, 12, 31, 22), _at(2026, 12, 31, 23))
    assert window_bounds("monthly", NY, now) == (_at(2026, 12, 1), _at(2027, 1, 1))


def test_a_rolling_window_frees_each_charge_its_window_after_it_was_made() -> None:
    ledger = CapacityLedger(_quota(2, window=60), ttl=30, now=0)
    for t in (0, 10):
        got = ledger.acquire("i", "m:a", 1, t)
        assert isinstance(got, tuple)
        ledger.release(got[0], None)
    assert "spent" in str(ledger.acquire("i", "m:a", 1, 59))
    assert ledger.state(59).resets_at == 60  # when the oldest charge leaves
    assert ledger.next_deadline() == 60
    assert ledger.roll(60) is True and ledger.used() == 1
    assert isinstance(ledger.acquire("i", "m:a", 1, 60), tuple)


def test_a_token_quota_reserves_the_estimate_and_reconciles_to_the_reported_usage() -> None:
    ledger = CapacityLedger(_quota(1000, unit="tokens", window="daily"), 30, _at(2026, 5, 1, 9))
    now = _at(2026, 5, 1, 9)
    got = ledger.acquire("i", "m:a", 400, now)
    assert isinstance(got, tuple) and ledger.used() == 400
    ledger.release(got[0], used_units=250)
    assert ledger.used() == 250
    other = ledger.acquire("i", "m:a", 900, now)  # may overshoot: something is left
    assert isinstance(other, tuple) and ledger.used() == 1150
    assert "spent" in str(ledger.acquire("i", "m:a", 1, now))
    ledger.release(other[0], used_units=None)  # nothing reported: the estimate stays
    assert ledger.used() == 1150


def test_an_http_json_pool_grants_nothing_until_its_first_reading() -> None:
    source = HttpJsonQuotaSource(
        kind="http_json", url="http://x/usage", used_path="used", limit_path="limit"
    )
    ledger = CapacityLedger(PoolSpec("h", "quota", None, source, ("m:a",)), 30, 0)
    assert "unresolved" in str(ledger.acquire("i", "m:a", 1, 0))
    assert ledger.reading(QuotaReading(pool="h", error="used_path 'usd' not found")) is True
    assert ledger.state(0).reason == "used_path 'usd' not found"
    assert ledger.reading(QuotaReading(pool="h", used=8, limit=10)) is True
    assert ledger.state(0).resolved and ledger.state(0).limit == 10
    for _ in range(2):
        assert isinstance(ledger.acquire("i", "m:a", 1, 0), tuple)
    assert "spent" in str(ledger.acquire("i", "m:a", 1, 0))


def test_pools_declared_two_ways_are_refused_naming_the_pool() -> None:
    def route(limit: int) -> dict[str, object]:
        return {
            "kind": "echo",
            "provider_type": "concurrency",
            "concurrency": {"limit": limit},
            "concurrency_pool": "team-plan",
        }

    with pytest.raises(ValidationError, match="capacity pool 'team-plan' is declared differently"):
        GatewayConfig.model_validate({"models": [{"id": "m", "route": [route(2), route(3)]}]})
    ok = GatewayConfig.model_validate({"models": [{"id": "m", "route": [route(2), route(2)]}]})
    assert [(p.pool, len(p.endpoints)) for p in capacity_pools(ok).values()] == [("team-plan", 2)]


# -- the actor ----------------------------------------------------------------------------


@asynccontextmanager
async def running(bus: InProcessBus, actor: CapacityActor) -> AsyncIterator[CapacityActor]:
    root = Supervisor("test", children=[ChildSpec(actor.name, lambda: actor)])
    await root.start(bus)
    try:
        yield actor
    finally:
        await root.stop()


async def _acquire(bus: InProcessBus, pool: str, units: float = 1) -> CapacityGrant:
    reply = await bus.request(
        subjects.capacity_acquire(pool),
        CapacityAcquire(pool=pool, endpoint="m:a", request_id="r", holder="ing", units=units),
        reply_type=CapacityGrant,
        timeout=WAIT,
    )
    assert isinstance(reply, CapacityGrant)
    return reply


async def _get(bus: InProcessBus, pool: str) -> CapacityState:
    reply = await bus.request(
        subjects.capacity_get(pool), CapacityGet(pool=pool), reply_type=CapacityState, timeout=WAIT
    )
    assert isinstance(reply, CapacityState)
    return reply


async def test_actor_publishes_state_on_grant_and_release_and_expires_unrenewed_leases(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with bus.subscribe(subjects.capacity_state("slots")) as states:
        actor = CapacityActor(_concurrency(1), LeaseConfig(ttl_seconds=30), clock=clock)
        async with running(bus, actor):
            assert (await next_event(states, CapacityState)).used == 0
            grant = await _acquire(bus, "slots")
            assert grant.granted and grant.expires_at == 1030
            assert (await next_event(states, CapacityState)).used == 1
            refused = await _acquire(bus, "slots")
            assert not refused.granted and "full" in refused.reason
            clock.now = 1020
            await bus.publish(
                subjects.capacity_renew("slots"),
                CapacityRenew(pool="slots", holder="ing", lease_ids=(grant.lease_id,)),
            )
            assert (await _get(bus, "slots")).used == 1  # the renewal is handled by now
            clock.now = 1040  # past the first TTL, inside the renewed one
            await actor.ctx.send_self(_Sweep())
            assert (await _get(bus, "slots")).used == 1
            clock.now = 1050
            await actor.ctx.send_self(_Sweep())
            assert (await next_event(states, CapacityState)).used == 0
            again = await _acquire(bus, "slots")
            assert again.granted
            await bus.publish(
                subjects.capacity_release("slots"),
                CapacityRelease(pool="slots", lease_id=again.lease_id),
            )
            assert (await next_event(states, CapacityState)).used == 1
            assert (await next_event(states, CapacityState)).used == 0


async def test_the_owner_expires_a_lease_at_its_maximum_age_and_warns_naming_the_pool(
    bus: InProcessBus,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    actor = CapacityActor(
        _concurrency(1), LeaseConfig(ttl_seconds=30, max_age_seconds=50), clock=clock
    )
    async with running(bus, actor):
        grant = await _acquire(bus, "slots")
        assert grant.granted and grant.expires_at == 1030
        for now in (1020.0, 1040.0):
            clock.now = now
            await bus.publish(
                subjects.capacity_renew("slots"),
                CapacityRenew(pool="slots", holder="ing", lease_ids=(grant.lease_id,)),
            )
            assert (await _get(bus, "slots")).used == 1  # renewed (and handled) by now
        clock.now = 1050  # the holder renewed in time, but it never released
        await actor.ctx.send_self(_Sweep())
        assert (await _get(bus, "slots")).used == 0
        assert (await _acquire(bus, "slots")).granted
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("pool slots reached its maximum age (50s)" in w for w in warnings), warnings


async def test_a_local_quota_count_survives_a_restart(
    bus: InProcessBus,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    try:
        spec = _quota(3, window="daily")
        async with running(bus, CapacityActor(spec, LeaseConfig(), snapshots=store, clock=clock)):
            assert (await _acquire(bus, "q")).granted
            assert (await _acquire(bus, "q")).granted
        async with running(bus, CapacityActor(spec, LeaseConfig(), snapshots=store, clock=clock)):
            assert (await _get(bus, "q")).used == 2
            assert (await _acquire(bus, "q")).granted
            assert not (await _acquire(bus, "q")).granted
    finally:
        await store.aclose()


async def test_an_unresolved_http_json_source_is_reported_once_per_reason(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    source = HttpJsonQuotaSource(
        kind="http_json",
        url="http://x/usage",
        used_path="used",
        limit_path="limit",
        refresh_seconds=60,
    )
    spec = PoolSpec("h", "quota", None, source, ("m:a",))
    async with bus.subscribe(subjects.event("quota")) as events:
        actor = CapacityActor(spec, LeaseConfig(), clock=clock)
        async with running(bus, actor):
            await actor.ctx.send_self(_FirstRefreshDue())
            first = await next_event(events, QuotaSourceStatus)
            assert (first.resolved, first.reason, first.endpoints) == (
                False,
                "no reading within the first refresh",
                ("m:a",),
            )
            await bus.publish(
                subjects.capacity_reading("h"),
                QuotaReading(pool="h", error="limit_path 'limit' not found"),
            )
            second = await next_event(events, QuotaSourceStatus)
            assert second.reason == "limit_path 'limit' not found"
            await bus.publish(
                subjects.capacity_reading("h"), QuotaReading(pool="h", used=1, limit=5)
            )
            assert (await next_event(events, QuotaSourceStatus)).resolved
            assert (await _get(bus, "h")).free == 4


# -- wiring: the tree, reloads, the decision's lease ----------------------------------------


def _pooled(limit: int) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "models": [
                {
                    "id": "m",
                    "route": [
                        {
                            "kind": "echo",
                            "provider_type": "concurrency",
                            "concurrency": {"limit": limit},
                            "concurrency_pool": "team",
                        },
                        {"kind": "echo", "fallback_only": True},
                    ],
                }
            ]
        }
    )


def test_a_reload_replaces_a_pool_owner_only_when_its_declaration_changed() -> None:
    from actors.reconfigure import diff

    same = diff(build_tree(_pooled(1)), build_tree(_pooled(1)))
    changed = diff(build_tree(_pooled(1)), build_tree(_pooled(2)))
    assert [c.label for c in same if c.path[:1] == ("capacity",)] == []
    assert ("replace", "capacity/capacity:team") in [(c.kind, c.label) for c in changed]


async def test_the_decision_leases_the_primary_and_a_full_pool_leaves_the_draw(
    bus: InProcessBus,
) -> None:
    from schemas import RoutePlan, RouteRequest

    root = build_tree(_pooled(1))
    await root.start(bus)
    try:

        async def plan() -> RoutePlan:
            reply = await bus.request(
                subjects.model_route("m"),
                RouteRequest(model="m", request_id="r", lease_holder="ing-1"),
                reply_type=RoutePlan,
                timeout=WAIT,
            )
            assert isinstance(reply, RoutePlan)
            return reply

        first = await plan()
        second = await plan()
        leased = first.candidates[0]
        assert (leased.endpoint, leased.pool) == ("m:echo", "team") and leased.lease_id
        assert second.candidates[0].endpoint == "m:echo-2"  # the slot is taken: the backup
        assert (await _get(bus, "team")).used == 1
    finally:
        await root.stop()


async def test_a_restarted_owner_keeps_the_leases_in_use(
    bus: InProcessBus,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    try:
        spec = _concurrency(1)
        async with running(
            bus, CapacityActor(spec, LeaseConfig(ttl_seconds=30), snapshots=store, clock=clock)
        ):
            held = await _acquire(bus, "slots")
        actor = CapacityActor(spec, LeaseConfig(ttl_seconds=30), snapshots=store, clock=clock)
        async with running(bus, actor):
            assert not (await _acquire(bus, "slots")).granted  # the slot is still leased
            clock.now = 1030  # nobody renews it: it expires as it would have
            await actor.ctx.send_self(_Sweep())
            assert (await _get(bus, "slots")).used == 0
            assert held.granted
    finally:
        await store.aclose()


async def test_a_lease_refused_behind_a_stale_view_drops_the_route_and_decides_again(
    bus: InProcessBus,
) -> None:
    from schemas import RoutePlan, RouteRequest

    root = build_tree(_pooled(1))
    await root.start(bus)
    try:
        assert (await _acquire(bus, "team")).granted  # another ingress holds the only slot
        # The model's view is told the pool is free (as if its state event were late).
        await bus.publish(
            subjects.capacity_state("team"),
            CapacityState(pool="team", kind="concurrency", limit=1, used=0, ts=1e12),
        )
        reply = await bus.request(
            subjects.model_route("m"),
            RouteRequest(model="m", request_id="r"),
            reply_type=RoutePlan,
            timeout=WAIT,
        )
        assert isinstance(reply, RoutePlan)
        assert [c.endpoint for c in reply.candidates] == ["m:echo-2"]
        assert not reply.candidates[0].lease_id
        assert (await _get(bus, "team")).used == 1  # the refused ask took nothing
    finally:
        await root.stop()


def _team(limit: int, *, extra_route: bool = False, kind: str = "concurrency") -> GatewayConfig:
    resource: dict[str, object] = (
        {
            "provider_type": "concurrency",
            "concurrency": {"limit": limit},
            "concurrency_pool": "team",
        }
        if kind == "concurrency"
        else {
            "provider_type": "quota",
            "quota": {"limit": limit},
            "quota_pool": "team",
            "quota_source": {"kind": "local", "window": "daily"},
        }
    )
    routes: list[dict[str, object]] = [{"kind": "echo", **resource}]
    if extra_route:
        routes.append({"kind": "echo", **resource})
    routes.append({"kind": "echo", "fallback_only": True})
    return GatewayConfig.model_validate({"models": [{"id": "m", "route": routes}]})


async def _reload(
    root: Supervisor, old: GatewayConfig, new: GatewayConfig, store: SnapshotStore
) -> list[str]:
    from actors.reconfigure import apply, diff

    changes = diff(build_tree(old, snapshots=store), build_tree(new, snapshots=store))
    done: list[Change] = []
    await apply(root, changes, done)
    return [f"{c.kind} {c.label}" for c in done]


@asynccontextmanager
async def _built(
    bus: InProcessBus, tmp_path: Path, config: GatewayConfig
) -> AsyncIterator[tuple[Supervisor, SnapshotStore]]:
    """The actor tree of ``config`` started on ``bus`` over a snapshot store in ``tmp_path``;
    stopped, and the store closed, on the way out."""
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    root = build_tree(config, snapshots=store)
    await root.start(bus)
    try:
        yield root, store
    finally:
        await root.stop()
        await store.aclose()


async def test_a_reloaded_pool_owner_takes_over_the_leases_granted_just_before_it(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    async with _built(bus, tmp_path, _team(1)) as (root, store):
        held = await _acquire(bus, "team")  # granted well within the owner's flush delay
        assert held.granted
        # The pool gains a route: its declaration changed, so its owner is replaced.
        assert "replace capacity/capacity:team" in await _reload(
            root, _team(1), _team(1, extra_route=True), store
        )
        state = await _get(bus, "team")
        assert (state.used, state.endpoints) == (1, ("m:echo", "m:echo-2"))
        assert not (await _acquire(bus, "team")).granted  # no second grant of the one slot
        await bus.publish(
            subjects.capacity_release("team"), CapacityRelease(pool="team", lease_id=held.lease_id)
        )
        assert (await _get(bus, "team")).used == 0  # the carried lease is the new owner's


async def test_a_pool_whose_kind_changed_does_not_carry_the_old_leases(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    quota = _team(5, kind="quota")
    async with _built(bus, tmp_path, quota) as (root, store):
        assert (await _acquire(bus, "team")).granted
        assert "replace capacity/capacity:team" in await _reload(root, quota, _team(1), store)
        state = await _get(bus, "team")
        assert (state.kind, state.used) == ("concurrency", 0)  # a quota unit is no slot
        assert (await _acquire(bus, "team")).granted


def _unpooled() -> GatewayConfig:
    return GatewayConfig.model_validate({"models": [{"id": "m", "route": [{"kind": "echo"}]}]})


async def test_a_pool_a_reload_removed_comes_back_without_the_leases_of_its_past_requests(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    async with _built(bus, tmp_path, _team(1)) as (root, store):
        held = await _acquire(bus, "team")  # a request in flight holds the only slot
        assert held.granted
        assert "remove capacity/capacity:team" in await _reload(root, _team(1), _unpooled(), store)
        # The request ends: its release finds no owner (nor does a renewal).
        await bus.publish(
            subjects.capacity_release("team"), CapacityRelease(pool="team", lease_id=held.lease_id)
        )
        assert "add capacity/capacity:team" in await _reload(root, _unpooled(), _team(1), store)
        assert (await _get(bus, "team")).used == 0  # not held until the lease's TTL
        assert (await _acquire(bus, "team")).granted


async def test_a_quota_pool_a_reload_removed_comes_back_with_its_count(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    quota = _team(2, kind="quota")
    async with _built(bus, tmp_path, quota) as (root, store):
        assert (await _acquire(bus, "team")).granted  # its lease is dropped, its charge not
        assert "remove capacity/capacity:team" in await _reload(root, quota, _unpooled(), store)
        assert "add capacity/capacity:team" in await _reload(root, _unpooled(), quota, store)
        assert (await _get(bus, "team")).used == 1  # the provider counted that request
        assert (await _acquire(bus, "team")).granted
        assert not (await _acquire(bus, "team")).granted


async def test_a_pool_unit_moved_to_another_host_keeps_the_leases_in_use(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    async with _built(bus, tmp_path, _team(1)) as (root, store):
        assert (await _acquire(bus, "team")).granted
        # As a cluster host hands the unit over (ClusterHost._drop) and the next one starts
        # it from the unit's snapshots: stopped, not retired.
        index = [s.name for s in root.specs].index("capacity")
        await root.remove_child("capacity")
        unit = build_tree(_team(1), snapshots=store).nested("capacity")
        assert unit is not None
        await root.add_child(unit, index=index)
        assert (await _get(bus, "team")).used == 1  # the request still runs: its slot held
        assert not (await _acquire(bus, "team")).granted


async def test_a_primary_lease_whose_answer_never_came_is_given_back_by_its_proposed_id(
    bus: InProcessBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    from schemas import RouteCandidate, RoutePlan, RouteRequest

    monkeypatch.setattr(actors.capacity_view, "_LEASE_TIMEOUT", 0.05)  # the answer is late
    config = _pooled(1).models[0]
    pooled, spare = config.endpoint_ids()

    async def decide(req: RouteRequest, skip: frozenset[str]) -> RoutePlan:
        c = RouteCandidate(endpoint=spare, kind="echo")
        if pooled not in skip:
            c = RouteCandidate(endpoint=pooled, kind="echo", pool="team")
        return RoutePlan(model="m", candidates=(c,))

    async with (
        bus.subscribe(subjects.capacity_acquire("team")) as owner,  # takes it, never answers
        bus.subscribe(subjects.capacity_release("team")) as releases,
    ):
        plan = await CapacityViews(config, "model:m").decide(
            RouteRequest(model="m", request_id="r"), decide, bus, 0.0
        )
        async with asyncio.timeout(WAIT):
            asked = (await anext(aiter(owner))).message
            released = (await anext(aiter(releases))).message

    assert [c.endpoint for c in plan.candidates] == [spare]  # the pool counted as refusing
    assert isinstance(asked, CapacityAcquire) and asked.lease_id
    assert released == CapacityRelease(
        pool="team", lease_id=asked.lease_id, used_units=0.0, unsent=True
    )
