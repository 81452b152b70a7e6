"""Actor.run on its own (no supervisor): serving, errors, local messages, mailbox, stopping."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from bus import BusClosedError, InProcessBus
from schemas import ErrorCode, ErrorReply, RoutePlan, RouteRequest, subjects
from tests.unit.actors import EchoActor, Journal, ask


async def test_actor_when_start_returns_answers_a_request_sent_at_once(bus: InProcessBus) -> None:
    actor = EchoActor()
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        reply = await ask(bus, "echo", "hi")
        actor.request_stop()
    assert reply == RoutePlan(model="hi", candidates=(), reason="echo#1")


async def test_actor_with_gateway_error_in_handle_replies_error_and_keeps_serving(
    bus: InProcessBus,
) -> None:
    actor = EchoActor()
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        error = await bus.request(
            subjects.model_route("echo"),
            RouteRequest(model="missing"),
            reply_type=RoutePlan,
            timeout=5.0,
        )
        after = await ask(bus, "echo", "again")
        actor.request_stop()
    assert isinstance(error, ErrorReply)
    assert error.code == ErrorCode.ROUTE_NOT_FOUND
    assert after.model == "again"


async def test_actor_with_crashing_handle_raises_from_run_and_runs_on_stop(
    bus: InProcessBus,
) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match=r"^boom$")):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run, bus)
            await bus.publish(subjects.model_route("echo"), RouteRequest(model="crash"))
    assert journal.entries == ["start:echo#1", "stop:echo#1"]


async def test_actor_crash_inside_task_groups_is_raised_unwrapped(bus: InProcessBus) -> None:
    with pytest.raises(RuntimeError, match=r"^boom$"):
        await EchoActor(script=("crash",)).run(bus)


async def test_actor_with_crashing_background_task_raises_its_error(bus: InProcessBus) -> None:
    with pytest.raises(RuntimeError, match=r"^background boom$"):
        await EchoActor(script=("bg-crash",)).run(bus)


async def test_actor_with_failing_on_start_raises_and_skips_on_stop(bus: InProcessBus) -> None:
    journal = Journal()
    with pytest.raises(RuntimeError, match="cannot start"):
        await EchoActor(journal=journal, fail_start=True).run(bus)
    assert journal.entries == ["start:echo#1"]


async def test_actor_stopping_itself_runs_on_stop_and_returns(bus: InProcessBus) -> None:
    journal = Journal()
    await EchoActor(journal=journal, script=("exit",)).run(bus)
    assert journal.entries == ["start:echo#1", "stop:echo#1"]


async def test_send_self_delivers_to_handle_local(bus: InProcessBus) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await ask(bus, "echo", "self:ping")
        await journal.wait_for("local:ping")
        actor.request_stop()


async def test_call_later_delivers_to_handle_local_after_delay(bus: InProcessBus) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await ask(bus, "echo", "later:tick")
        await journal.wait_for("local:tick")
        actor.request_stop()
    assert journal.entries.index("msg:later:tick") < journal.entries.index("local:tick")


async def test_call_later_when_cancelled_never_delivers(bus: InProcessBus) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        actor.ctx.call_later(0.01, "cancelled").cancel()
        actor.ctx.call_later(0.02, "kept")
        await journal.wait_for("local:kept")
        actor.request_stop()
    assert "local:cancelled" not in journal.entries


async def test_full_mailbox_holds_the_forwarder_back_without_losing_messages(
    bus: InProcessBus,
) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal, mailbox_size=1)
    subject = subjects.model_route("echo")
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await bus.publish(subject, RouteRequest(model="block"))
        await actor.blocked.wait()
        for i in range(20):
            await bus.publish(subject, RouteRequest(model=f"n{i}"))
        actor.release.set()
        await journal.wait_for("msg:n19")
        actor.request_stop()
    handled = [e for e in journal.entries if e.startswith("msg:n")]
    assert handled == [f"msg:n{i}" for i in range(20)]


async def test_a_flooded_actor_lets_the_rest_of_the_process_run_between_messages(
    bus: InProcessBus,
) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    subject = subjects.model_route("echo")
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        for i in range(200):  # none of these handlers ever suspends
            await bus.publish(subject, RouteRequest(model=f"n{i}"))
        while (handled := sum(e.startswith("msg:n") for e in journal.entries)) < 200:
            seen.append(handled)
            await asyncio.sleep(0)  # one turn of the loop, as any other task gets
        actor.request_stop()
    assert any(0 < n < 200 for n in seen), seen


async def test_send_self_from_handle_with_full_mailbox_does_not_deadlock(
    bus: InProcessBus,
) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal, mailbox_size=1)
    subject = subjects.model_route("echo")
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await bus.publish(subject, RouteRequest(model="block"))
        await actor.blocked.wait()
        await bus.publish(subject, RouteRequest(model="fanout"))
        await bus.publish(subject, RouteRequest(model="filler"))
        actor.release.set()
        await journal.wait_for("local:f2")
        await journal.wait_for("msg:filler")
        actor.request_stop()
    local = [e for e in journal.entries if e.startswith("local:")]
    assert local == ["local:f0", "local:f1", "local:f2"]


async def test_request_stop_lets_the_message_in_hand_finish_then_runs_on_stop(
    bus: InProcessBus,
) -> None:
    journal = Journal()
    actor = EchoActor(journal=journal)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await bus.publish(subjects.model_route("echo"), RouteRequest(model="block"))
        await actor.blocked.wait()
        actor.request_stop()
        actor.release.set()
    assert journal.entries == ["start:echo#1", "msg:block", "stop:echo#1"]


async def test_actor_whose_subscription_ends_with_the_bus_raises_bus_closed(
    bus: InProcessBus,
) -> None:
    actor = EchoActor()
    with pytest.RaisesGroup(BusClosedError):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run, bus)
            await bus.aclose()
