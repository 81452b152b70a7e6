"""Cluster hosts on one in-process bus: placement split, takeover, handback break before
make, the lapse of a cut-off host, and fenced snapshot writes. Rounds are driven by hand
(``reconcile``) under a fake clock, so nothing waits on time."""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, Supervisor
from actors.cluster import (
    HOSTS_BUCKET,
    OWNERS_BUCKET,
    SNAPSHOTS_BUCKET,
    ClusterHost,
    FencedSnapshots,
    Owners,
    owner_of,
)
from bus import InProcessBus, open_bus
from schemas import AdminCommand, AdminReply, RoutePlan, RouteRequest, raise_for_reply, subjects
from schemas.config import ClusterConfig
from tests.unit.actors import WAIT, EchoActor, FakeClock, Journal
from tests.unit.actors.cluster_support import UNITS, CuttableBus, echo_tree

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from actors import SnapshotStore
    from bus import Bus, KvEntry

SETTINGS = ClusterConfig(enabled=True, heartbeat_seconds=1.0, ttl_seconds=3.0)


@pytest.fixture
async def hosts(shared: InProcessBus, clock: FakeClock) -> AsyncIterator[list[ClusterHost]]:
    journal = Journal()
    made = [
        ClusterHost(shared, node, SETTINGS, functools.partial(echo_tree, journal), clock=clock)
        for node in ("host-a", "host-b")
    ]
    for host in made:
        await host.open()
    yield made
    for host in made:
        await host.aclose()


def assert_one_owner(hosts: list[ClusterHost]) -> None:
    """No unit runs on two hosts at once."""
    a, b = (set(h.units) for h in hosts)
    assert not a & b
    for host in hosts:
        for unit in host.units:
            host.root.child(unit)  # running, not just recorded


async def test_two_hosts_split_the_units_by_rendezvous_and_never_both_run_one(
    hosts: list[ClusterHost], shared: InProcessBus
) -> None:
    a, b = hosts
    await a.reconcile()  # alone so far: takes everything
    assert a.units == list(UNITS)
    for host in (b, a, b):  # b cannot take its share until a released it
        await host.reconcile()
        assert_one_owner(hosts)
    live = ["host-a", "host-b"]
    assert a.units == [u for u in UNITS if owner_of(u, live) == "host-a"]
    assert b.units == [u for u in UNITS if owner_of(u, live) == "host-b"]
    assert a.units and b.units
    owners = await shared.key_value(OWNERS_BUCKET)
    for host in hosts:
        for unit in host.units:
            entry = await owners.get(unit)
            assert entry is not None and entry.value == host.node_id.encode()
    for unit in UNITS:  # every unit answers on its subject, wherever it runs
        reply = await shared.request(
            subjects.model_route(unit), RouteRequest(model="m"), reply_type=RoutePlan, timeout=5
        )
        assert isinstance(reply, RoutePlan)


async def test_a_host_whose_heartbeat_lapsed_loses_its_units_and_takes_them_back_after(
    hosts: list[ClusterHost], clock: FakeClock
) -> None:
    a, b = hosts
    for host in (a, b, a, b):
        await host.reconcile()
    share_a = list(a.units)
    for _ in range(3):  # a stops beating for its TTL; b beats every heartbeat
        clock.now += SETTINGS.heartbeat_seconds
        await b.reconcile()
    assert b.units == list(UNITS)  # b took a's share over by compare-and-set
    await a.reconcile()  # a wakes past its lease deadline: it stops without releasing
    assert a.units == []
    assert_one_owner(hosts)
    await a.reconcile()  # and beats again, but b holds its share: it waits
    assert a.units == []
    await b.reconcile()  # b hands a's share back: stops and releases first
    assert_one_owner(hosts)
    await a.reconcile()
    assert_one_owner(hosts)
    assert a.units == share_a


async def _members(bus: Bus) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin("cluster", "members"),
        AdminCommand(args={}, by="test"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    return raise_for_reply(reply).result


async def test_cluster_members_lists_the_live_hosts_their_units_and_the_units_nobody_owns(
    hosts: list[ClusterHost], shared: InProcessBus, clock: FakeClock
) -> None:
    a, b = hosts
    for host in (a, b, a, b):
        await host.reconcile()
    split = await _members(shared)
    assert [m["node_id"] for m in split["members"]] == ["host-a", "host-b"]
    for member, host in zip(split["members"], hosts, strict=True):
        assert member["role"] == "actors" and member["units"] == host.units
        assert member["since"] <= member["last_heartbeat"]
    assert split["unowned"] == [] and split["answered_by"] in ("host-a", "host-b")

    for _ in range(2):  # a stops beating; b beats every heartbeat
        clock.now += SETTINGS.heartbeat_seconds
        await b.reconcile()
    clock.now += SETTINGS.heartbeat_seconds  # a's key lapses: its share is nobody's yet
    lapsed = await _members(shared)
    assert [m["node_id"] for m in lapsed["members"]] == ["host-b"]
    assert lapsed["unowned"] == split["members"][0]["units"]
    await b.reconcile()
    taken = await _members(shared)
    assert taken["members"][0]["units"] == list(UNITS) and taken["unowned"] == []
    assert taken["members"][0]["since"] == split["members"][1]["since"]  # the same member


async def test_cluster_members_say_which_config_each_host_runs_as_of_its_last_beat(
    shared: InProcessBus, clock: FakeClock
) -> None:
    """A host that did not follow a reload (its file refused, a unit that failed to start)
    said so only in its own log: the reload's answer came from the host that took it."""
    versions = {"host-a": "v1", "host-b": "v1"}
    made = [
        ClusterHost(
            shared,
            node,
            SETTINGS,
            functools.partial(echo_tree, Journal()),
            clock=clock,
            config_version=functools.partial(versions.__getitem__, node),
        )
        for node in versions
    ]
    try:
        for host in made:
            await host.open()
            await host.reconcile()
        before = await _members(shared)
        versions["host-a"] = "v2"  # host-a applied a reload; host-b did not follow it
        clock.now += SETTINGS.heartbeat_seconds
        for host in made:
            await host.reconcile()
        after = await _members(shared)
    finally:
        for host in made:
            await host.aclose()

    assert [m["config_version"] for m in before["members"]] == ["v1", "v1"]
    assert [m["config_version"] for m in after["members"]] == ["v2", "v1"]


async def test_a_second_process_under_a_node_id_in_use_runs_nothing_until_the_first_lapses(
    shared: InProcessBus, clock: FakeClock
) -> None:
    journal = Journal()
    first, second = (
        ClusterHost(shared, "host-a", SETTINGS, functools.partial(echo_tree, journal), clock=clock)
        for _ in range(2)
    )
    for host in (first, second):
        await host.open()
    try:
        await first.reconcile()
        await second.reconcile()  # same id: its first beat finds the key taken
        await first.reconcile()
        assert (first.units, second.units) == (list(UNITS), [])
        clock.now += SETTINGS.ttl_seconds  # the first one stops beating (it died)
        await second.reconcile()
        assert second.units == list(UNITS)
    finally:
        for host in (first, second):
            await host.aclose()


class _Ticks:
    """The ``sleep`` of a host's background loop: a sleeper wakes once the test has moved
    the fake clock to its time."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._moved = asyncio.Condition()

    async def sleep(self, seconds: float) -> None:
        due = self._clock.now + seconds
        async with self._moved:
            await self._moved.wait_for(lambda: self._clock.now >= due)

    async def advance(self, seconds: float) -> None:
        self._clock.now += seconds
        async with self._moved:
            self._moved.notify_all()


async def test_a_placement_round_stuck_on_jetstream_never_holds_up_the_heartbeat(
    shared: InProcessBus, clock: FakeClock
) -> None:
    """Starting units (snapshots, databases) is slow on a busy machine: a beat queued behind
    it would reach the lease deadline, and the host would stop every unit for nothing."""
    cut_bus = CuttableBus(shared)
    ticks = _Ticks(clock)
    host = ClusterHost(
        cut_bus,
        "host-a",
        SETTINGS,
        functools.partial(echo_tree, Journal()),
        clock=clock,
        sleep=ticks.sleep,
    )
    heartbeats = await shared.key_value(HOSTS_BUCKET, ttl=SETTINGS.ttl_seconds)
    try:
        async with heartbeats.watch() as beats:
            await host.start()
            assert host.units == list(UNITS)
            await anext(beats)
            cut_bus.gates[OWNERS_BUCKET].clear()  # every placement round now hangs
            for _ in range(3 * round(SETTINGS.ttl_seconds / SETTINGS.heartbeat_seconds)):
                await ticks.advance(SETTINGS.heartbeat_seconds)
                async with asyncio.timeout(WAIT):
                    await anext(beats)  # the beat landed all the same
            assert host.units == list(UNITS)  # and the lease deadline moved with it
    finally:
        cut_bus.gates[OWNERS_BUCKET].set()
        await host.aclose()
        await cut_bus.aclose()


async def test_a_cut_off_host_stops_its_units_before_its_heartbeat_can_lapse(
    shared: InProcessBus, clock: FakeClock
) -> None:
    cut_bus = CuttableBus(shared)
    host = ClusterHost(
        cut_bus, "host-a", SETTINGS, functools.partial(echo_tree, Journal()), clock=clock
    )
    await host.open()
    try:
        await host.reconcile()
        assert host.units == list(UNITS)
        cut_bus.cut[0] = True
        clock.now += SETTINGS.ttl_seconds - SETTINGS.heartbeat_seconds - 0.1
        await host.reconcile()
        assert host.units == list(UNITS)  # within the lease: keeps serving
        clock.now += 0.1
        await host.reconcile()
        assert host.units == []  # before the key lapses (ttl after the last beat was sent)
        hosts = await shared.key_value("llmgw_hosts", ttl=SETTINGS.ttl_seconds)
        assert await hosts.get("host-a") is not None  # still counted live by the others
    finally:
        cut_bus.cut[0] = False
        await host.aclose()
        await cut_bus.aclose()


async def test_a_host_back_from_a_lapse_releases_the_units_it_stopped_that_are_not_its_share(
    shared: InProcessBus, clock: FakeClock
) -> None:
    # A host that took every unit (alone at first) and then missed its lease deadline stops
    # them without releasing; back within its key's TTL it is still live, so the other host
    # may not take its share from it. Before: neither ran those units again (an e2e run saw
    # four units unowned for 20 s); now the host back releases what is not its share.
    cut_bus = CuttableBus(shared)
    journal = Journal()
    a = ClusterHost(cut_bus, "host-a", SETTINGS, functools.partial(echo_tree, journal), clock=clock)
    b = ClusterHost(shared, "host-b", SETTINGS, functools.partial(echo_tree, journal), clock=clock)
    await a.open()
    await b.open()
    try:
        await a.reconcile()
        assert a.units == list(UNITS)
        cut_bus.cut[0] = True
        clock.now += SETTINGS.ttl_seconds - SETTINGS.heartbeat_seconds
        await a.reconcile()
        assert a.units == []  # past its lease deadline: stopped, entries left
        cut_bus.cut[0] = False
        await b.reconcile()  # a's key has not lapsed: b waits for a to release
        assert b.units == []
        for host in (a, b, a, b):
            await host.reconcile()
            assert_one_owner([a, b])
        live = ["host-a", "host-b"]
        assert a.units == [u for u in UNITS if owner_of(u, live) == "host-a"]
        assert b.units == [u for u in UNITS if owner_of(u, live) == "host-b"]
    finally:
        await a.aclose()
        await b.aclose()
        await cut_bus.aclose()


@pytest.fixture(params=["inprocess", pytest.param("nats", marks=pytest.mark.nats)])
async def two_connections(
    request: pytest.FixtureRequest, shared: InProcessBus
) -> AsyncIterator[tuple[Bus, Bus]]:
    """The old and the new owner's buses: one in-process bus, or two NATS connections."""
    if request.param == "inprocess":
        yield shared, shared
        return
    url = request.getfixturevalue("nats_url")
    old, new = await open_bus(url), await open_bus(url)
    try:
        yield old, new
    finally:
        await old.aclose()
        await new.aclose()


async def test_fenced_snapshot_write_of_an_owner_that_lost_its_lease_is_refused(
    two_connections: tuple[Bus, Bus],
) -> None:
    old_bus, new_bus = two_connections
    unit = f"limits-{uuid.uuid4().hex}"  # the buckets outlive a test on a shared server
    owners = Owners(await old_bus.key_value(OWNERS_BUCKET))
    kv = await old_bus.key_value(SNAPSHOTS_BUCKET)
    new_owners = Owners(await new_bus.key_value(OWNERS_BUCKET))
    new_kv = await new_bus.key_value(SNAPSHOTS_BUCKET)
    lost: list[str] = []
    old_lease = await owners.claim(unit, "host-a", ["host-a", "host-b"])
    assert old_lease is not None
    assert await owners.claim(unit, "host-b", ["host-a", "host-b"]) is None  # a is live
    old = FencedSnapshots(kv, owners, old_lease, on_lost=lambda: lost.append("a"))
    await old.save(unit, b"v1", 0.0, durable=True)

    new_lease = await new_owners.claim(unit, "host-b", ["host-b"])  # a's heartbeat lapsed
    assert new_lease is not None and new_lease.revision != old_lease.revision
    new = FencedSnapshots(new_kv, new_owners, new_lease, on_lost=lambda: lost.append("b"))
    assert await new.load(unit) == b"v1"  # the new owner starts from the last write
    await old.save(unit, b"stale", 1.0)
    assert await old.drain(WAIT)  # refused, not left pending
    await new.save(unit, b"v2", 2.0, durable=True)
    await old.aclose()
    await new.aclose()

    assert (old.refused, new.refused, lost) == (1, 0, ["a"])
    entry: KvEntry | None = await kv.get(unit)
    assert entry is not None and entry.value == b"v2"
    assert not await owners.holds(old_lease)
    await owners.release(old_lease)  # a lost lease is not released from its new owner
    assert await owners.holds(new_lease)


def test_the_default_heartbeat_lease_outlasts_a_nats_leader_election() -> None:
    """While a bucket elects a leader (a NATS server died) no beat lands; a host must not stop
    its units for that. NATS's Raft election timeout is at most 9 s (then a vote)."""
    default = ClusterConfig(enabled=True)
    assert default.ttl_seconds - default.heartbeat_seconds > 9.0 + 1.0


def test_buckets_keep_as_many_copies_as_the_cluster_allows_unless_told() -> None:
    default, told = ClusterConfig(enabled=True), ClusterConfig(enabled=True, replicas=2)
    assert [default.replicas_on(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert [told.replicas_on(n) for n in (1, 3)] == [2, 2]


def _reloaded(journal: Journal, failing: str = "") -> Any:
    """A new tree description: every unit's actor changed (another journal), ``failing``'s
    unable to start."""

    def build(snapshots: SnapshotStore | None) -> Supervisor:
        children = [
            ChildSpec(u, functools.partial(EchoActor, u, journal, fail_start=u == failing))
            for u in UNITS
        ]
        return Supervisor("root", children=children)

    return build


async def test_a_reload_replaces_the_units_a_host_runs_and_a_later_takeover_starts_the_new_ones(
    hosts: list[ClusterHost], clock: FakeClock
) -> None:
    a, b = hosts
    for host in (a, b, a, b):
        await host.reconcile()
    share_a, share_b = list(a.units), list(b.units)
    reloaded = Journal()

    changes = await a.reconfigure(_reloaded(reloaded))

    assert changes == sorted(f"replace {u}" for u in share_a)
    assert sorted(reloaded.entries) == sorted(f"start:{u}#1" for u in share_a)
    for _ in range(3):  # b stops beating: a takes its share over, built from the reload
        clock.now += SETTINGS.heartbeat_seconds
        await a.reconcile()
    assert a.units == list(UNITS)
    assert sorted(reloaded.entries) == sorted(f"start:{u}#1" for u in share_a + share_b)


async def test_a_reload_whose_unit_fails_to_start_leaves_the_old_units_running(
    hosts: list[ClusterHost],
) -> None:
    a, _ = hosts
    await a.reconcile()  # alone: runs every unit
    refused = Journal()

    with pytest.raises(RuntimeError, match="cannot start"):
        await a.reconfigure(_reloaded(refused, failing=UNITS[-1]))

    assert a.units == list(UNITS)
    running = [a.root.child(u) for u in UNITS]
    assert all(isinstance(r, EchoActor) and r.journal is not refused for r in running)
    assert [e for e in refused.entries if e.startswith("start:")] == [f"start:{u}#1" for u in UNITS]


class _CountingBus(InProcessBus):
    """An in-process bus that says it sees ``servers`` and records how each bucket is asked
    for (its replicas, and whether as a floor)."""

    def __init__(self, servers: int) -> None:
        super().__init__()
        self._servers = servers
        self.asked: dict[str, tuple[int, bool]] = {}

    @property
    def servers(self) -> int:
        return self._servers

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> Any:
        self.asked[bucket] = (replicas, grow_only)
        return await super().key_value(bucket, ttl=ttl)


@pytest.mark.parametrize(("configured", "asked"), [(None, (2, True)), (1, (1, False))])
async def test_a_default_replica_count_only_raises_the_buckets_a_set_one_is_applied(
    clock: FakeClock, configured: int | None, asked: tuple[int, bool]
) -> None:
    # The client sees two servers: the default is two copies, never lowering what a bucket
    # has (a host starting while the cluster forms sees fewer than there are).
    bus = _CountingBus(servers=2)
    settings = SETTINGS.model_copy(update={"replicas": configured})
    tree = functools.partial(echo_tree, Journal())
    host = ClusterHost(bus, "host-a", settings, tree, clock=clock)
    await host.open()
    try:
        assert bus.asked == dict.fromkeys((HOSTS_BUCKET, OWNERS_BUCKET, SNAPSHOTS_BUCKET), asked)
    finally:
        await host.aclose()
