"""admin_request when the bus connection is lost while a command waits for its reply: back
within the grace, the command keeps waiting and gets its answer; not back, it ends with
OutcomeUnknownError (it may have been applied), never at its timeout. The link is an
in-process bus cut and restored as a NATS connection is (tests.unit.actors.cluster_support)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

from bus import InProcessBus
from gateway.admin import http as admin_http
from gateway.admin.http import admin_request
from schemas import AdminReply, OutcomeUnknownError, subjects
from tests.unit.actors.cluster_support import Link

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

TIMEOUT_S = 45.0  # past the test's own bound: a command that waits it out fails the test
BOUND_S = 10.0


@pytest.fixture
async def inner() -> AsyncIterator[InProcessBus]:
    bus = InProcessBus()
    yield bus
    await bus.aclose()


async def test_a_command_whose_connection_is_back_within_the_grace_gets_its_answer(
    inner: InProcessBus,
) -> None:
    link = Link(inner)
    async with inner.subscribe(subjects.admin_area("a")) as owner, anyio.create_task_group() as tg:
        answers: list[dict[str, object]] = []

        async def command() -> None:
            answers.append(await admin_request(link, "a", "v", by="t", timeout=TIMEOUT_S))

        tg.start_soon(command)
        with anyio.fail_after(BOUND_S):
            env = await anext(aiter(owner))
            link.drop()
            await anyio.lowlevel.checkpoint()  # a turn for the command's watch to see the loss
            link.restore()
            await env.respond(AdminReply(result={"applied": True}))
    assert answers == [{"applied": True}]


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
