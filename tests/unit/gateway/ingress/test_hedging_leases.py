"""A RouteWise hedge whose backup is a capacity route, against a real CapacityActor on the
in-process bus and the dispatcher tests' scripted adapter: the backup is leased only when the
hedge fires (a primary that answers in time never holds its slot), a backup that loses the
race gives its slot back, and a backup its pool refuses leaves the primary alone (its error,
not the refusal, is the answer). A backup stopped while its pool's grant is on its way
back gives the slot back all the same. And a fallback on a capacity route stopped while its
pool answers tells the ModelActor it was never sent."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import CapacityActor, ChildSpec, Supervisor
from gateway.ingress.settling import LeaseKeeper
from schemas import (
    CapacityGet,
    CapacityState,
    FirstToken,
    Observation,
    RoutePlan,
    UpstreamError,
    subjects,
)
from schemas.capacity import PoolSpec
from schemas.config import LeaseConfig
from tests.unit.gateway.ingress.test_dispatcher import (
    Answer,
    Fail,
    FakeClock,
    Hang,
    Harness,
    Heard,
    Script,
    ScriptedAdapter,
    cand,
    plan,
    serve,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus
    from gateway.adapters.base import JSON, Batch, UpstreamTarget
    from schemas import Message

PRIMARY, SLOT = "m:a", "m:slot"


@dataclass
class BackupFirst(ScriptedAdapter):
    """The scripted adapter, whose primary answers only once the backup was sent (so the
    hedge has certainly fired and the backup holds its lease when it loses)."""

    backup_sent: anyio.Event = field(default_factory=anyio.Event)

    def _next(self, target: UpstreamTarget) -> Script:
        script = super()._next(target)
        if target.endpoint == SLOT:
            self.backup_sent.set()
        return script

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        if target.endpoint == PRIMARY:
            await self.backup_sent.wait()
        return await super().complete(target, body)

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        if target.endpoint == PRIMARY:
            await self.backup_sent.wait()
        async for batch in super().stream(target, body):
            yield batch


@dataclass
class AnswersWhileLeasing(ScriptedAdapter):
    """The scripted adapter, whose primary answers once the backup is leasing its slot."""

    leasing: anyio.Event = field(default_factory=anyio.Event)

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        if target.endpoint == PRIMARY:
            await self.leasing.wait()
        return await super().complete(target, body)

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        if target.endpoint == PRIMARY:
            await self.leasing.wait()
        async for batch in super().stream(target, body):
            yield batch


@pytest.fixture(params=[False, True], ids=["once", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def heard(bus: InProcessBus) -> AsyncIterator[Heard]:
    h = Heard(bus)
    async with bus.subscribe(subjects.PREFIX + ".>") as sub:
        h._sub = sub
        yield h


@pytest.fixture
async def pool(bus: InProcessBus) -> AsyncIterator[None]:
    """The slot route's pool owner: one concurrency slot."""
    spec = PoolSpec(SLOT, "concurrency", 1.0, None, (SLOT,))
    root = Supervisor("t", children=[ChildSpec("cap", lambda: CapacityActor(spec, LeaseConfig()))])
    await root.start(bus)
    yield
    await root.stop()


async def used(bus: InProcessBus) -> float:
    st = await bus.request(
        subjects.capacity_get(SLOT), CapacityGet(pool=SLOT), reply_type=CapacityState, timeout=5.0
    )
    assert isinstance(st, CapacityState), st
    return st.used


def held_grant(
    bus: InProcessBus, monkeypatch: pytest.MonkeyPatch, leasing: anyio.Event
) -> anyio.Event:
    """The slot pool's grants held on their way back (a NATS round trip) until the event
    returned is set; ``leasing`` is set once one is."""
    answer_back = anyio.Event()
    ask = bus.request

    async def request(subject: str, msg: Message, *, reply_type: Any, timeout: float) -> Any:
        reply = await ask(subject, msg, reply_type=reply_type, timeout=timeout)
        if subject == subjects.capacity_acquire(SLOT):
            leasing.set()
            await answer_back.wait()
        return reply

    monkeypatch.setattr(bus, "request", request)
    return answer_back


def hedged(after_ms: float) -> RoutePlan:
    return RoutePlan(
        model="m", candidates=(cand(PRIMARY), cand(SLOT, pool=SLOT)), hedge_after_ms=after_ms
    )


async def test_a_primary_answering_in_time_never_leases_the_hedge_backup(
    bus: InProcessBus,
    clock: FakeClock,
    heard: Heard,
    pool: None,
    stream: bool,
) -> None:
    h = Harness(bus, ScriptedAdapter(clock, scripts={PRIMARY: [Answer()]}), clock, heard)
    assert await serve(h, hedged(60_000.0), stream) == PRIMARY
    await heard.drain()
    assert h.adapter.calls == [PRIMARY]
    assert not [s for s, _ in heard.messages if s == subjects.capacity_acquire(SLOT)]
    assert await used(bus) == 0


async def test_a_hedge_backup_that_loses_the_race_gives_its_slot_back(
    bus: InProcessBus,
    clock: FakeClock,
    heard: Heard,
    pool: None,
    stream: bool,
) -> None:
    adapter = BackupFirst(clock, scripts={PRIMARY: [Answer()], SLOT: [Hang()]})
    h = Harness(bus, adapter, clock, heard)
    assert await serve(h, hedged(0.0), stream) == PRIMARY
    await heard.drain()
    assert sorted(adapter.calls) == [PRIMARY, SLOT]  # each sent once
    assert [s for s, _ in heard.messages if s == subjects.capacity_acquire(SLOT)]
    declined = [o for o in heard.observations() if o.endpoint == SLOT]
    assert [(o.outcome, o.error_kind) for o in declined] == [("cancelled", "hedge_declined")]
    assert await used(bus) == 0


async def test_a_hedge_backup_its_pool_refuses_leaves_the_primary_alone(
    bus: InProcessBus,
    clock: FakeClock,
    heard: Heard,
    pool: None,
) -> None:
    other = LeaseKeeper(bus, 30.0, "other-ingress")
    assert await other.acquire(cand(SLOT, pool=SLOT), "elsewhere") is not None  # slot taken
    h = Harness(bus, ScriptedAdapter(clock, scripts={PRIMARY: [Fail(500)]}), clock, heard)
    with pytest.raises(UpstreamError) as failed:
        await h.call(hedged(0.0))
    await heard.drain()
    assert failed.value.status == 500 and failed.value.endpoint == PRIMARY
    assert h.adapter.calls == [PRIMARY]  # the refused backup was never sent
    assert all(isinstance(o, Observation) and o.endpoint == PRIMARY for o in heard.observations())
    assert await used(bus) == 1  # the other holder's slot, untouched


async def test_a_hedge_backup_stopped_while_its_grant_is_on_its_way_gives_the_slot_back(
    bus: InProcessBus,
    clock: FakeClock,
    heard: Heard,
    pool: None,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pool grants the backup's lease; its answer is on its way back (a NATS round trip)
    # when the primary wins and the race cancels the backup with a plain ``task.cancel()``.
    adapter = AnswersWhileLeasing(clock, scripts={PRIMARY: [Answer()], SLOT: [Answer()]})
    answer_back = held_grant(bus, monkeypatch, adapter.leasing)
    h = Harness(bus, adapter, clock, heard)
    served: list[str] = []

    async def run() -> None:
        served.append(await serve(h, hedged(0.0), stream))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await adapter.leasing.wait()
            await anyio.wait_all_tasks_blocked()  # the primary won, the backup was stopped
            answer_back.set()
        await anyio.wait_all_tasks_blocked()  # what the late answer sets off has run
    assert served == [PRIMARY]
    assert adapter.calls == [PRIMARY]  # the backup was never sent
    assert await used(bus) == 0  # before: the slot stayed taken until the lease's TTL


async def test_a_fallback_stopped_while_its_pool_answers_is_said_unsent(
    bus: InProcessBus,
    clock: FakeClock,
    heard: Heard,
    pool: None,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The primary failed, so the ModelActor counts the fallback as sent; the request's task is
    # cancelled outright (``task.cancel()``: no anyio scope) while the pool's grant is on its
    # way back. The fallback and the candidate after it must be said unsent, and the slot freed.
    adapter = ScriptedAdapter(clock, scripts={PRIMARY: [Fail(500)], SLOT: [Answer()]})
    leasing = anyio.Event()
    answer_back = held_grant(bus, monkeypatch, leasing)
    h = Harness(bus, adapter, clock, heard)
    served = asyncio.ensure_future(
        serve(h, plan(cand(PRIMARY), cand(SLOT, pool=SLOT), cand("m:c")), stream)
    )
    with anyio.fail_after(5):
        await leasing.wait()
        served.cancel()
        answer_back.set()
        with pytest.raises(asyncio.CancelledError):
            await served
        await anyio.wait_all_tasks_blocked()  # what the late answer sets off has run
    await heard.drain()
    assert adapter.calls == [PRIMARY]
    unsent = [m.endpoint for _, m in heard.messages if isinstance(m, FirstToken) and m.unsent]
    assert unsent == [SLOT, "m:c"]  # before: none (counted in flight until the flight's TTL)
    assert await used(bus) == 0
