"""Cluster snapshots are written behind the actors: an actor keeps answering while JetStream
takes no write (a bucket electing its leader after a NATS server died), only the latest
snapshot of each name is written, an operator's command still answers once its change is
stored, and a unit handed back has its last snapshot written before its lease is released."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

import pytest

from actors import Actor, ActorContext, ChildSpec, Serve, Supervisor
from actors.cluster import (
    OWNERS_BUCKET,
    SNAPSHOTS_BUCKET,
    ClusterHost,
    FencedSnapshots,
    Owners,
    owner_of,
)
from actors.cluster.fenced import DURABLE_WAIT_SECONDS
from schemas import BusTimeoutError, RoutePlan, RouteRequest, subjects
from schemas.config import ClusterConfig
from tests.unit.actors import WAIT, FakeClock
from tests.unit.actors.cluster_support import CuttableBus

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from actors import SnapshotStore
    from bus import Envelope, InProcessBus

UNITS = ("endpoints", "keys", "models", "limits", "rules", "steering")
SETTINGS = ClusterConfig(enabled=True, heartbeat_seconds=1.0, ttl_seconds=3.0)
NOT_YET = 0.2  # how long a test watches for something that must not happen yet


class CountingActor(Actor):
    """Answers each ``RouteRequest`` on ``model_route(name)`` with the number of requests it
    has answered (``reason``), counting on from its snapshot; saves the count after each
    one and when it stops, as the real actors save their durable state."""

    def __init__(self, name: str, snapshots: SnapshotStore | None) -> None:
        self.name = name
        self.serves = (Serve(subjects.model_route(name)),)
        self._snapshots = snapshots
        self._count = 0

    async def on_start(self, ctx: ActorContext) -> None:
        if self._snapshots is not None:
            self._count = int(await self._snapshots.load(self.name) or b"0")

    async def handle(self, env: Envelope) -> None:
        self._count += 1
        await self._save()
        await env.respond(RoutePlan(model=self.name, candidates=(), reason=str(self._count)))

    async def on_stop(self) -> None:
        await self._save()

    async def _save(self) -> None:
        if self._snapshots is not None:
            await self._snapshots.save(self.name, str(self._count).encode(), 0.0)


def counters(snapshots: SnapshotStore | None) -> Supervisor:
    return Supervisor(
        "root",
        children=[ChildSpec(u, functools.partial(CountingActor, u, snapshots)) for u in UNITS],
    )


@pytest.fixture
async def gated(shared: InProcessBus) -> AsyncIterator[CuttableBus]:
    """``shared``'s buckets behind gates a test closes (JetStream not answering)."""
    b = CuttableBus(shared)
    yield b
    for gate in b.gates.values():
        gate.set()
    await b.aclose()


async def _store(
    bus: CuttableBus, unit: str, durable_wait: float = DURABLE_WAIT_SECONDS
) -> FencedSnapshots:
    owners = Owners(await bus.key_value(OWNERS_BUCKET))
    lease = await owners.claim(unit, "host-a", ["host-a"])
    assert lease is not None
    kv = await bus.key_value(SNAPSHOTS_BUCKET)
    return FencedSnapshots(kv, owners, lease, on_lost=lambda: None, durable_wait=durable_wait)


async def test_a_save_returns_while_jetstream_takes_nothing_and_only_the_latest_follows(
    shared: InProcessBus, gated: CuttableBus
) -> None:
    store = await _store(gated, "models")
    gated.gates[SNAPSHOTS_BUCKET].clear()
    async with asyncio.timeout(WAIT):
        for value in (b"1", b"2", b"3"):
            await store.save("models", value, 0.0)  # handed over: the actor goes on
    assert await store.load("models") == b"3"  # what it handed over reads back at once
    assert not await store.drain(NOT_YET)
    kv = await shared.key_value(SNAPSHOTS_BUCKET)
    written: list[bytes] = []
    async with kv.watch() as changes:
        gated.gates[SNAPSHOTS_BUCKET].set()  # a leader again
        assert await store.drain(WAIT)
        async with asyncio.timeout(WAIT):
            while not written or written[-1] != b"3":
                written.append((await anext(changes)).value)
    assert written == [b"3"]  # saves no write could take meanwhile collapse into the latest
    await store.aclose()


async def test_an_operator_save_answers_once_stored_or_says_it_is_not_yet(
    shared: InProcessBus, gated: CuttableBus
) -> None:
    store = await _store(gated, "rules")
    gated.gates[SNAPSHOTS_BUCKET].clear()
    saving = asyncio.create_task(store.save("rules", b"v1", 0.0, durable=True))
    done, _ = await asyncio.wait([saving], timeout=NOT_YET)
    assert not done  # waits for the write, unlike a routine save
    gated.gates[SNAPSHOTS_BUCKET].set()
    async with asyncio.timeout(WAIT):
        await saving
    entry = await (await shared.key_value(SNAPSHOTS_BUCKET)).get("rules")
    assert entry is not None and entry.value == b"v1"
    await store.aclose()

    impatient = await _store(gated, "chains", durable_wait=NOT_YET)
    gated.gates[SNAPSHOTS_BUCKET].clear()
    with pytest.raises(BusTimeoutError, match="applied but not yet stored"):
        await impatient.save("chains", b"v1", 0.0, durable=True)
    await impatient.aclose()


async def test_a_unit_answers_while_its_snapshots_wait_and_hands_the_last_one_over(
    shared: InProcessBus, gated: CuttableBus, clock: FakeClock
) -> None:
    a = ClusterHost(gated, "host-a", SETTINGS, counters, clock=clock)
    # a's actors serve on ``gated``'s own subjects, b's on ``shared``'s; they share buckets.
    b = ClusterHost(shared, "host-b", SETTINGS, counters, clock=clock)
    moving = next(u for u in UNITS if owner_of(u, ["host-a", "host-b"]) == "host-b")

    async def ask(bus: InProcessBus) -> str:
        reply = await bus.request(
            subjects.model_route(moving), RouteRequest(model="m"), reply_type=RoutePlan, timeout=1
        )
        assert isinstance(reply, RoutePlan)
        return reply.reason

    try:
        await a.open()
        await b.open()
        await a.reconcile()
        assert a.units == list(UNITS)
        gated.gates[SNAPSHOTS_BUCKET].clear()  # the snapshots bucket has no leader
        assert [await ask(gated) for _ in range(3)] == ["1", "2", "3"]

        await b.reconcile()  # b joins; a holds its share until it released it
        handback = asyncio.create_task(a.reconcile())
        done, _ = await asyncio.wait([handback], timeout=NOT_YET)
        assert not done  # the lease waits for the last snapshot
        gated.gates[SNAPSHOTS_BUCKET].set()
        async with asyncio.timeout(WAIT):
            await handback
        assert moving not in a.units
        await b.reconcile()
        assert moving in b.units
        assert await ask(shared) == "4"  # b went on from a's last count
    finally:
        gated.gates[SNAPSHOTS_BUCKET].set()
        await a.aclose()
        await b.aclose()
