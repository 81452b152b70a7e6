"""Supervisor: adding, removing and replacing children while it runs (config reload)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pytest

from actors import ChildSpec, Supervisor
from bus import InProcessBus, NoRespondersError
from schemas import ChildStarted, RouteRequest, subjects
from tests.unit.actors import EchoActor, Journal, ask, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def root(bus: InProcessBus) -> AsyncIterator[Supervisor]:
    sup = Supervisor("root", children=[Supervisor("group", children=[])])
    await sup.start(bus)
    yield sup
    await sup.stop()


def echo(name: str, journal: Journal, **kw: object) -> ChildSpec:
    return ChildSpec(name, functools.partial(EchoActor, name, journal, **kw))  # type: ignore[arg-type]


async def test_add_child_starts_it_and_announces_it(bus: InProcessBus, root: Supervisor) -> None:
    journal = Journal()
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await root.add_child(echo("a", journal))
        assert await next_event(events, ChildStarted, "a") == ChildStarted(
            supervisor="root", child="a"
        )
    assert (await ask(bus, "a")).reason == "a#1"
    assert [s.name for s in root.specs] == ["group", "a"]


async def test_add_child_to_a_nested_supervisor_stops_with_the_tree(bus: InProcessBus) -> None:
    journal = Journal()
    group = Supervisor("group", children=[])
    sup = Supervisor("root", children=[group])
    await sup.start(bus)
    nested = sup.nested("group")
    assert nested is group
    await group.add_child(echo("a", journal))
    await sup.stop()
    assert journal.entries == ["start:a#1", "stop:a#1"]


async def test_add_child_with_taken_name_raises_value_error(root: Supervisor) -> None:
    await root.add_child(echo("a", Journal()))
    with pytest.raises(ValueError, match="already has a child 'a'"):
        await root.add_child(echo("a", Journal()))


async def test_add_child_that_fails_to_start_raises_and_is_forgotten(root: Supervisor) -> None:
    with pytest.raises(RuntimeError, match="cannot start"):
        await root.add_child(echo("bad", Journal(), fail_start=True))
    assert [s.name for s in root.specs] == ["group"]
    await root.add_child(echo("bad", Journal()))  # the name is free again


async def test_remove_child_stops_it_and_its_subjects_go_unanswered(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    await root.add_child(echo("a", journal))
    await root.remove_child("a")
    assert journal.entries[-1] == "stop:a#1"
    with pytest.raises(NoRespondersError):
        await ask(bus, "a")
    with pytest.raises(KeyError):
        await root.remove_child("a")


async def test_remove_child_retiring_it_retires_every_actor_below_it_and_nothing_else(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    group = root.nested("group")
    assert group is not None
    await group.add_child(echo("a", journal))
    await root.add_child(Supervisor("unit", children=[echo("b", journal), echo("c", journal)]))
    await root.add_child(Supervisor("moved", children=[echo("d", journal)]))
    await group.remove_child("a", retire=True)  # a reload removed it
    await root.remove_child("unit", retire=True)  # a reload removed the whole group
    await root.remove_child("moved")  # a unit handed to another host: not retired
    assert journal.entries[-4:] == ["retire:a#1", "retire:c#1", "retire:b#1", "stop:d#1"]


async def test_replace_child_starts_the_new_one_before_stopping_the_old(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    await root.add_child(echo("a", journal))
    await root.replace_child(echo("a", journal))
    assert journal.entries == ["start:a#1", "start:a#2", "stop:a#1"]
    assert (await ask(bus, "a")).reason == "a#2"
    assert root.child("a") is not None


async def test_replace_child_whose_new_start_fails_keeps_the_old_one(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    await root.add_child(echo("a", journal))
    with pytest.raises(RuntimeError, match="cannot start"):
        await root.replace_child(echo("a", journal, fail_start=True))
    assert (await ask(bus, "a")).reason == "a#1"


async def test_replaced_child_that_crashes_is_restarted_from_its_new_spec(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    await root.add_child(echo("a", journal))
    await root.replace_child(echo("a", journal))
    await bus.publish(subjects.model_route("a"), RouteRequest(model="crash"))
    await journal.wait_for("start:a#3")
    assert (await ask(bus, "a")).reason == "a#3"


async def test_an_exclusive_child_is_replaced_break_before_make(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    spec = echo("a", journal)
    await root.add_child(ChildSpec("a", spec.factory, exclusive=True))
    await root.replace_child(ChildSpec("a", echo("a", journal).factory, exclusive=True))
    assert journal.entries == ["start:a#1", "stop:a#1", "start:a#2"]  # never two at once
    assert (await ask(bus, "a")).reason == "a#2"


async def test_an_exclusive_child_whose_replacement_fails_is_started_again_from_its_spec(
    bus: InProcessBus, root: Supervisor
) -> None:
    journal = Journal()
    await root.add_child(ChildSpec("a", echo("a", journal).factory, exclusive=True))
    with pytest.raises(RuntimeError, match="cannot start"):
        await root.replace_child(
            ChildSpec("a", echo("a", journal, fail_start=True).factory, exclusive=True)
        )
    assert (await ask(bus, "a")).reason == "a#3"  # the old spec, a fresh incarnation
    assert journal.entries[:2] == ["start:a#1", "stop:a#1"]
