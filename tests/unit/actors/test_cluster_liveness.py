"""Cluster hosts telling a dead peer from a slow one (``actors.cluster.liveness``), on one
in-process bus under a fake clock with the default heartbeat and TTL: a host no process
answers for is taken over long before its key lapses, one that answers is not, and one cut
off longer than its serving lease answers for nothing and, found removed, stops its units
before joining again. Rounds and asks are driven by hand, so nothing waits on time."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pytest

from actors.cluster import HOSTS_BUCKET, ClusterHost, owner_of
from bus import InProcessBus, RequestTimeoutError
from schemas import RoutePlan, RouteRequest, subjects
from schemas.config import ClusterConfig
from tests.unit.actors import FakeClock, Journal
from tests.unit.actors.cluster_support import UNITS, Link, echo_tree

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import Bus

SETTINGS = ClusterConfig(enabled=True)  # beats every 1 s, keys lapse after 12 s
ASK_S = SETTINGS.heartbeat_seconds / 4  # the asking cadence of a host


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def link(shared: InProcessBus) -> Link:
    return Link(shared)


@pytest.fixture
async def hosts(
    shared: InProcessBus, link: Link, clock: FakeClock, journal: Journal
) -> AsyncIterator[list[ClusterHost]]:
    """host-a on ``link`` (its connection can be cut), host-b on the bus itself, split."""
    buses: list[Bus] = [link, shared]
    made = [
        ClusterHost(bus, node, SETTINGS, functools.partial(echo_tree, journal), clock=clock)
        for bus, node in zip(buses, ("host-a", "host-b"), strict=True)
    ]
    for host in made:
        await host.open()
    for host in (*made, *made):
        await host.reconcile()
    yield made
    for host in made:
        await host.aclose()


def share(node: str) -> list[str]:
    return [u for u in UNITS if owner_of(u, ["host-a", "host-b"]) == node]


async def steps(clock: FakeClock, host: ClusterHost, seconds: float) -> None:
    """Run ``host`` for ``seconds``: an ask round every ``ASK_S``, a beat and placement
    round every heartbeat."""
    for n in range(1, round(seconds / ASK_S) + 1):
        clock.now += ASK_S
        await host.ask_round()
        if n % 4 == 0:
            await host.reconcile()


async def test_a_host_no_process_answers_for_is_taken_over_long_before_its_key_lapses(
    hosts: list[ClusterHost], link: Link, shared: InProcessBus, clock: FakeClock
) -> None:
    a, b = hosts
    assert a.units == share("host-a") and b.units == share("host-b")
    link.drop()  # host-a's process is gone: its server closed its connection
    await steps(clock, b, 4.0)
    assert b.units == list(UNITS)  # a third of the 12 s TTL
    hosts_kv = await shared.key_value(HOSTS_BUCKET, ttl=SETTINGS.ttl_seconds)
    assert sorted(await hosts_kv.keys()) == ["host-b"]  # its key removed, not lapsed


async def test_a_host_that_answers_keeps_its_share_while_its_beats_do_not_land(
    hosts: list[ClusterHost], shared: InProcessBus, clock: FakeClock
) -> None:
    a, b = hosts
    for _ in range(8):  # host-a beats nothing (JetStream electing, say), answers every ask
        await steps(clock, b, 1.0)
        await a.ask_round()  # and hears host-b: its serving lease runs on
    assert b.units == share("host-b") and a.units == share("host-a")
    unit = a.units[0]
    plan = await shared.request(  # still served by host-a
        subjects.model_route(unit), RouteRequest(model="m"), reply_type=RoutePlan, timeout=5
    )
    assert isinstance(plan, RoutePlan) and plan.reason.startswith(unit)


async def test_a_host_cut_off_past_its_lease_answers_nothing_and_stops_its_units_found_removed(
    hosts: list[ClusterHost], link: Link, shared: InProcessBus, clock: FakeClock, journal: Journal
) -> None:
    a, b = hosts
    moved = share("host-a")
    link.drop()  # a's connection drops, its process lives on
    for n in range(1, 17):
        clock.now += ASK_S
        await a.ask_round()  # unanswered: nothing renews its serving lease
        await b.ask_round()
        if n % 4 == 0:
            await b.reconcile()
    assert b.units == list(UNITS)  # host-a taken for dead
    link.restore()  # host-a reconnects: its units' subscriptions are back on the bus
    await a.ask_round()  # host-b answers, but too late to vouch for a lease that ran out

    # Two subscribers of each moved unit now: only the new owner may answer.
    for unit in moved:
        plan = await shared.request(
            subjects.model_route(unit),
            RouteRequest(model=f"after-{unit}"),
            reply_type=RoutePlan,
            timeout=5,
        )
        assert isinstance(plan, RoutePlan)
    await a.reconcile()  # its beat finds its key gone: it stops every unit, then joins again
    assert a.units == []
    for unit in moved:
        assert journal.entries.count(f"msg:after-{unit}") == 1, unit  # never by host-a
    await b.reconcile()  # host-a is live again: host-b hands its share back
    assert a.units == [] and b.units == share("host-b")
    await a.reconcile()
    assert a.units == moved


async def test_a_request_to_a_host_past_its_lease_waits_and_is_answered_once_a_beat_lands(
    hosts: list[ClusterHost], shared: InProcessBus, clock: FakeClock
) -> None:
    a, _ = hosts
    clock.now += 3 * SETTINGS.heartbeat_seconds  # no beat, no answered ask: the lease ran out
    unit = a.units[0]
    with pytest.raises(RequestTimeoutError):  # held, not answered, while past the lease
        await shared.request(
            subjects.model_route(unit), RouteRequest(model="m"), reply_type=RoutePlan, timeout=0.2
        )
    await a.reconcile()  # its own key still there: it answers for its units again
    plan = await shared.request(
        subjects.model_route(unit), RouteRequest(model="m"), reply_type=RoutePlan, timeout=5
    )
    assert isinstance(plan, RoutePlan)


async def test_a_host_alone_answers_for_its_units_while_its_beats_do_not_land(
    shared: InProcessBus, clock: FakeClock, journal: Journal
) -> None:
    host = ClusterHost(
        shared, "host-a", SETTINGS, functools.partial(echo_tree, journal), clock=clock
    )
    await host.open()
    try:
        await host.reconcile()
        for _ in range(32):  # 8 s without a beat (JetStream electing a leader): it asks itself
            clock.now += ASK_S
            await host.ask_round()
        plan = await shared.request(
            subjects.model_route("models"), RouteRequest(model="m"), reply_type=RoutePlan, timeout=5
        )
        assert isinstance(plan, RoutePlan)
    finally:
        await host.aclose()


async def test_a_host_never_seen_to_beat_is_not_taken_for_dead_by_one_that_joined_after(
    shared: InProcessBus, link: Link, clock: FakeClock, journal: Journal
) -> None:
    """The newcomer is in no listing of the silent host, which may still answer for its units
    where it is (a split between NATS servers): only its key's TTL hands them over."""
    build = functools.partial(echo_tree, journal)
    a = ClusterHost(link, "host-a", SETTINGS, build, clock=clock)
    b = ClusterHost(shared, "host-b", SETTINGS, build, clock=clock)
    await a.open()
    await b.open()
    try:
        await a.reconcile()
        link.drop()  # host-a unseen from here on, and its key never changes again
        await steps(clock, b, 8.0)
        hosts_kv = await shared.key_value(HOSTS_BUCKET, ttl=SETTINGS.ttl_seconds)
        assert sorted(await hosts_kv.keys()) == ["host-a", "host-b"]
        assert b.units == []  # all host-a's while its key lives
        await steps(clock, b, 5.0)  # the key lapses
        assert sorted(await hosts_kv.keys()) == ["host-b"], b.units
        assert b.units == list(UNITS)
    finally:
        await b.aclose()
        await a.aclose()
