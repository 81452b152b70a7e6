"""Supervisor: start/stop order, restarts by strategy and restart kind, intensity, nesting."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

import pytest

from actors import ChildSpec, Restart, Strategy, Supervisor, SupervisorGaveUpError
from bus import BusClosedError, InProcessBus, NoRespondersError
from schemas import (
    ChildFailed,
    ChildRestarted,
    ChildStarted,
    Message,
    RouteRequest,
    SupervisorGaveUp,
    subjects,
)
from tests.unit.actors import EchoActor, FakeClock, Journal, ask, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


@pytest.fixture
async def supervisors() -> AsyncIterator[list[Supervisor]]:
    """Roots a test started; each is stopped when the test ends, even when it failed."""
    roots: list[Supervisor] = []
    yield roots
    for root in reversed(roots):
        await root.stop()


def echo(
    name: str, journal: Journal, *, restart: Restart = Restart.PERMANENT, shutdown: float = 5.0
) -> ChildSpec:
    factory = functools.partial(EchoActor, name, journal)
    return ChildSpec(name, factory, restart=restart, shutdown=shutdown)


async def start(
    bus: InProcessBus,
    roots: list[Supervisor],
    *children: ChildSpec | Supervisor,
    strategy: Strategy = Strategy.ONE_FOR_ONE,
    intensity: int = 3,
    period: float = 5.0,
    clock: Callable[[], float] | None = None,
) -> Supervisor:
    """Start a root named ``root`` over ``children``; the fixture stops it after the test."""
    root = Supervisor(
        "root",
        strategy=strategy,
        intensity=intensity,
        period=period,
        clock=clock,
        children=children,
    )
    roots.append(root)
    await root.start(bus)
    return root


async def crash(bus: InProcessBus, name: str) -> None:
    await bus.publish(subjects.model_route(name), RouteRequest(model="crash"))


async def test_start_returns_once_children_serve_and_announces_each(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await start(bus, supervisors, echo("a", journal), echo("b", journal))
        assert (await ask(bus, "b")).reason == "b#1"
        assert await next_event(events, ChildStarted) == ChildStarted(supervisor="root", child="a")
        assert await next_event(events, ChildStarted) == ChildStarted(supervisor="root", child="b")


async def test_crashed_actor_is_restarted_as_fresh_instance_and_serves_again(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        root = await start(bus, supervisors, echo("echo", journal))
        first = root.child("echo")
        await crash(bus, "echo")
        failed = await next_event(events, ChildFailed)
        restarted = await next_event(events, ChildRestarted)
    assert failed == ChildFailed(supervisor="root", child="echo", error="RuntimeError: boom")
    assert restarted == ChildRestarted(supervisor="root", child="echo", restarts=1)
    assert (await ask(bus, "echo")).reason == "echo#2"
    assert root.child("echo") is not first


async def test_restart_is_logged_as_warning(
    bus: InProcessBus, supervisors: list[Supervisor], caplog: pytest.LogCaptureFixture
) -> None:
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await start(bus, supervisors, echo("echo", Journal()))
        with caplog.at_level(logging.WARNING, logger="actors.supervisor"):
            await crash(bus, "echo")
            await next_event(events, ChildRestarted)
    assert any("restarting echo" in r.getMessage() for r in caplog.records)


async def test_more_restarts_than_intensity_within_period_gives_up(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        root = await start(
            bus, supervisors, echo("echo", journal), intensity=2, period=5.0, clock=FakeClock()
        )
        for _ in range(2):
            await crash(bus, "echo")
            await next_event(events, ChildRestarted)
        await crash(bus, "echo")
        gave_up = await next_event(events, SupervisorGaveUp)
    assert gave_up == SupervisorGaveUp(supervisor="root", restarts=3, period=5.0)
    with pytest.raises(SupervisorGaveUpError) as info:
        await root.wait()
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(NoRespondersError):
        await ask(bus, "echo")


async def test_restarts_spread_wider_than_period_never_give_up(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    clock = FakeClock()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await start(bus, supervisors, echo("echo", Journal()), intensity=1, period=5.0, clock=clock)
        for _ in range(4):
            clock.now += 5.0
            await crash(bus, "echo")
            await next_event(events, ChildRestarted)
    assert (await ask(bus, "echo")).reason == "echo#5"


async def test_permanent_child_that_exits_normally_is_restarted(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await start(bus, supervisors, echo("echo", Journal()))
        await ask(bus, "echo", "exit")
        await next_event(events, ChildRestarted, "echo")
    assert (await ask(bus, "echo")).reason == "echo#2"


async def test_transient_child_is_restarted_after_crash_but_not_after_normal_exit(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        root = await start(
            bus,
            supervisors,
            echo("echo", journal, restart=Restart.TRANSIENT),
            echo("witness", journal),
        )
        await crash(bus, "echo")
        await next_event(events, ChildRestarted, "echo")
        await ask(bus, "echo", "exit")
        await journal.wait_for("stop:echo#2")
        # The supervisor handles exits in order, so this restart follows the exit's handling.
        await crash(bus, "witness")
        await next_event(events, ChildRestarted, "witness")
    with pytest.raises(KeyError):
        root.child("echo")
    with pytest.raises(NoRespondersError):
        await ask(bus, "echo")


async def test_temporary_child_is_never_restarted_after_crash(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        root = await start(
            bus,
            supervisors,
            echo("echo", journal, restart=Restart.TEMPORARY),
            echo("witness", journal),
        )
        await crash(bus, "echo")
        await next_event(events, ChildFailed, "echo")
        await crash(bus, "witness")
        restarted = await next_event(events, ChildRestarted)
    assert restarted.child == "witness"
    with pytest.raises(KeyError):
        root.child("echo")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (Strategy.ONE_FOR_ONE, ["stop:b#1", "start:b#2"]),
        (
            Strategy.ONE_FOR_ALL,
            ["stop:b#1", "stop:c#1", "stop:a#1", "start:a#2", "start:b#2", "start:c#2"],
        ),
        (Strategy.REST_FOR_ONE, ["stop:b#1", "stop:c#1", "start:b#2", "start:c#2"]),
    ],
)
async def test_crash_of_middle_child_restarts_the_strategy_set_in_order(
    bus: InProcessBus, supervisors: list[Supervisor], strategy: Strategy, expected: list[str]
) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await start(
            bus,
            supervisors,
            *(echo(n, journal) for n in "abc"),
            strategy=strategy,
        )
        before = len(journal.entries)
        await crash(bus, "b")
        last = "b" if strategy is Strategy.ONE_FOR_ONE else "c"
        await next_event(events, ChildRestarted, last)
    assert journal.entries[before:] == expected
    serving = {n: (await ask(bus, n)).reason for n in "abc"}
    assert serving["b"] == "b#2"
    assert serving["a"] == ("a#2" if strategy is Strategy.ONE_FOR_ALL else "a#1")


async def test_children_start_in_list_order_and_stop_in_reverse(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    root = await start(bus, supervisors, *(echo(n, journal) for n in "abc"))
    await root.stop()
    assert journal.entries == [
        "start:a#1",
        "start:b#1",
        "start:c#1",
        "stop:c#1",
        "stop:b#1",
        "stop:a#1",
    ]


async def test_child_that_ignores_stop_is_cancelled_after_its_shutdown_time(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    root = await start(bus, supervisors, echo("echo", journal, shutdown=0.01))
    hung = root.child("echo")
    assert isinstance(hung, EchoActor)
    await bus.publish(subjects.model_route("echo"), RouteRequest(model="hang"))
    await hung.blocked.wait()
    await root.stop()
    assert journal.entries == ["start:echo#1"]  # cancelled: on_stop never ran
    await root.wait()


async def test_stop_leaves_no_tasks_and_no_subscriptions(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    before = asyncio.all_tasks()
    journal = Journal()
    inner = Supervisor("inner", children=[echo("b", journal)])
    root = await start(bus, supervisors, echo("a", journal), inner)
    await ask(bus, "a", "later:tick")
    await root.stop()
    await root.stop()  # idempotent
    assert asyncio.all_tasks() == before
    for name in ("a", "b"):
        with pytest.raises(NoRespondersError):
            await ask(bus, name)


async def test_nested_supervisor_that_gives_up_is_restarted_by_its_parent(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    inner = Supervisor("inner", intensity=0, children=[echo("echo", Journal())])
    async with bus.subscribe(subjects.SUPERVISOR_EVENTS_ANY) as events:
        root = await start(bus, supervisors, inner)
        await crash(bus, "echo")
        gave_up = await next_event(events, SupervisorGaveUp)
        failed = await next_event(events, ChildFailed, "inner")
        await next_event(events, ChildRestarted, "inner")
    assert gave_up.supervisor == "inner"
    assert failed.error.startswith("SupervisorGaveUpError")
    nested = root.child("inner")
    assert isinstance(nested, Supervisor)
    assert nested.child("echo") is not None
    assert (await ask(bus, "echo")).reason == "echo#2"


async def test_children_of_nested_supervisors_see_the_root_clock(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    clock = FakeClock()
    clock.now = 42.0
    inner = Supervisor("inner", children=[echo("echo", Journal())])
    root = await start(bus, supervisors, inner, clock=clock)
    nested = root.child("inner")
    assert isinstance(nested, Supervisor)
    actor = nested.child("echo")
    assert isinstance(actor, EchoActor)
    assert actor.ctx.clock() == 42.0


async def test_start_with_child_failing_on_start_raises_and_stops_started_children(
    bus: InProcessBus, supervisors: list[Supervisor]
) -> None:
    journal = Journal()
    broken = ChildSpec("b", functools.partial(EchoActor, "b", journal, fail_start=True))
    with pytest.raises(RuntimeError, match="b#1 cannot start"):
        await start(bus, supervisors, echo("a", journal), broken, echo("c", journal))
    assert journal.entries == ["start:a#1", "start:b#1", "stop:a#1"]


class _EventlessBus(InProcessBus):
    """An InProcessBus on which supervisor events fail to publish; it journals each refusal."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal

    async def publish(self, subject: str, msg: Message) -> None:
        if subject == subjects.supervisor_event("root"):
            self.journal.add(f"refused:{type(msg).__name__}")
            raise BusClosedError("events are down")
        await super().publish(subject, msg)


async def test_supervisor_whose_events_fail_to_publish_still_restarts_children(
    supervisors: list[Supervisor],
) -> None:
    journal = Journal()
    bus = _EventlessBus(journal)
    try:
        await start(bus, supervisors, echo("echo", journal))
        await crash(bus, "echo")
        await journal.wait_for("refused:ChildRestarted")
        assert (await ask(bus, "echo")).reason == "echo#2"
    finally:
        await supervisors.pop().stop()
        await bus.aclose()
