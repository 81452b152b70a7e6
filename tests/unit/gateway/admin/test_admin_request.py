"""admin_request when the bus connection is lost while a command waits for its reply: back
within the grace, the command is sent again under the same request id (its answer may have
been lost with the connection) and the copy's answer is returned, the copy sent again while
its owner's own connection is not back; not back, it ends with OutcomeUnknownError (it may
have been applied), never at its timeout. And an owner's own ``no_responders`` answer reaches
the caller as it is. The links are an in-process bus cut and restored as a NATS connection is
(tests.unit.actors.cluster_support)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from bus import InProcessBus
from gateway.admin import http as admin_http
from gateway.admin.http import admin_request
from schemas import (
    AdminCommand,
    AdminReply,
    BusDisconnectedError,
    NoRespondersError,
    OutcomeUnknownError,
    subjects,
)
from tests.unit.actors.cluster_support import Link

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup

    from schemas import Message

TIMEOUT_S = 45.0  # past the test's own bound: a command that waits it out fails the test
BOUND_S = 10.0


@pytest.fixture
async def inner() -> AsyncIterator[InProcessBus]:
    bus = InProcessBus()
    yield bus
    await bus.aclose()


def _command(tg: TaskGroup, bus: Link) -> list[dict[str, object]]:
    """Start a command to area ``a`` on ``bus`` in ``tg``; the list its result goes into."""
    answers: list[dict[str, object]] = []

    async def command() -> None:
        answers.append(await admin_request(bus, "a", "v", by="t", timeout=TIMEOUT_S))

    tg.start_soon(command)
    return answers


async def test_a_command_whose_connection_is_back_within_the_grace_is_sent_again(
    inner: InProcessBus,
) -> None:
    link = Link(inner)
    async with inner.subscribe(subjects.admin_area("a")) as owner, anyio.create_task_group() as tg:
        answers = _command(tg, link)
        with anyio.fail_after(BOUND_S):
            commands = aiter(owner)
            first = await anext(commands)
            link.drop()
            await anyio.lowlevel.checkpoint()  # a turn for the command's watch to see the loss
            link.restore()
            copy = await anext(commands)  # its answer to the first went into the lost link
            await copy.respond(AdminReply(result={"applied": True}))
    assert answers == [{"applied": True}]
    assert isinstance(first.message, AdminCommand) and isinstance(copy.message, AdminCommand)
    assert copy.message.request_id == first.message.request_id != ""


class _CountingLink(Link):
    """A link that says when it has sent ``n`` requests."""

    def __init__(self, inner: InProcessBus) -> None:
        super().__init__(inner)
        self.sent = 0
        self._wanted: tuple[int, anyio.Event] | None = None

    async def request(self, subject: str, msg: Message, **kw: Any) -> Any:
        self.sent += 1
        if self._wanted is not None and self.sent >= self._wanted[0]:
            self._wanted[1].set()
        return await super().request(subject, msg, **kw)

    async def until_sent(self, n: int) -> None:
        event = anyio.Event()
        self._wanted = (n, event)
        if self.sent < n:
            await event.wait()


async def test_a_copy_that_finds_no_owner_is_sent_again_until_the_owner_is_back(
    inner: InProcessBus,
) -> None:
    ingress, owner_link = _CountingLink(inner), Link(inner)
    async with (
        owner_link.subscribe(subjects.admin_area("a")) as owner,
        anyio.create_task_group() as tg,
    ):
        answers = _command(tg, ingress)
        with anyio.fail_after(BOUND_S):
            commands = aiter(owner)
            await anext(commands)
            ingress.drop()
            owner_link.drop()  # both lose the server; the ingress is back first
            await anyio.lowlevel.checkpoint()
            ingress.restore()
            await ingress.until_sent(3)  # the first, a copy nobody took, and another
            owner_link.restore()
            copy = await anext(commands)
            await copy.respond(AdminReply(result={"applied": True}))
    assert answers == [{"applied": True}]


async def test_an_owner_s_own_no_responders_answer_reaches_the_caller_as_it_is(
    inner: InProcessBus,
) -> None:
    async with inner.subscribe(subjects.admin_area("a")) as owner, anyio.create_task_group() as tg:

        async def stop_before_running() -> None:
            env = await anext(aiter(owner))
            stopping = NoRespondersError("the a owner stopped before running v: retry")
            await env.respond(stopping.to_reply())

        tg.start_soon(stop_before_running)
        with anyio.fail_after(BOUND_S), pytest.raises(NoRespondersError, match="stopped"):
            await admin_request(inner, "a", "v", by="t", timeout=TIMEOUT_S)


async def test_a_command_whose_connection_stays_lost_ends_with_outcome_unknown(
    inner: InProcessBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_http, "RECONNECT_GRACE_S", 0.1)
    link = Link(inner)
    async with inner.subscribe(subjects.admin_area("a")) as owner, anyio.create_task_group() as tg:

        async def lose_it() -> None:
            await anext(aiter(owner))  # the owner has it, and answers nothing
            link.drop()

        tg.start_soon(lose_it)
        with anyio.fail_after(BOUND_S), pytest.raises(OutcomeUnknownError, match="unknown"):
            await admin_request(link, "a", "v", by="t", timeout=TIMEOUT_S)


async def test_the_wait_for_a_lost_connection_before_sending_ends_at_the_deadline(
    inner: InProcessBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_http, "RECONNECT_GRACE_S", 60.0)  # past the bound below
    link = Link(inner)
    link.drop()
    with anyio.fail_after(BOUND_S), pytest.raises(BusDisconnectedError):
        await admin_request(link, "a", "v", by="t", timeout=0.5)
