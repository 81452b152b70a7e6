"""A state-changing admin command runs once per verb and request id (``actors.admin``,
``actors.admin_once``): the same command sent again, as its sender does when it lost the
connection its answer went to, gets the first one's answer, done or refused, and does not run
twice; a copy sent while the first still runs (or awaits its check) is answered when it ends,
also when the answer to the first cannot be sent; a read-only verb, a command with no id, or
another verb under the same id just runs; the answers kept are bounded in number and age."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest

import actors.admin_once
from actors.admin import AdminArea, AdminChecked
from bus import BusClosedError
from bus.codec import Envelope
from schemas import (
    AdminCommand,
    AdminExecuted,
    AdminReply,
    ErrorReply,
    InvalidRequestError,
    subjects,
)

if TYPE_CHECKING:
    from actors.base import ActorContext
    from schemas import Message


class _Ctx:
    """An ActorContext's ``publish`` (the audit), kept."""

    def __init__(self) -> None:
        self.published: list[Message] = []

    async def publish(self, subject: str, msg: Message) -> None:
        self.published.append(msg)


class _Replies:
    """The answers sent to each envelope made by :meth:`env`, by its reply subject."""

    def __init__(self) -> None:
        self.to: dict[str, list[Message]] = {}

    async def _respond(self, reply: str, msg: Message) -> None:
        self.to.setdefault(reply, []).append(msg)

    def env(self, reply: str, verb: str = "put", request_id: str = "r-1") -> Envelope:
        cmd = AdminCommand(by="test", request_id=request_id)
        return Envelope(subjects.admin("rules", verb), cmd, reply, self._respond)


class _Widgets:
    """The ``rules`` area, its ``put`` counting its runs (and held while ``held`` is unset),
    its ``get`` (read-only in ``schemas.READ_ONLY_ADMIN_VERBS``) counting them too."""

    def __init__(self) -> None:
        self.runs = 0
        self.held: anyio.Event | None = None
        self.refuse = False
        self.area = AdminArea("rules", {"put": self._apply, "get": self._show})

    async def _apply(self, cmd: AdminCommand) -> dict[str, Any]:
        self.runs += 1
        if self.held is not None:
            await self.held.wait()
        if self.refuse:
            raise InvalidRequestError("no such widget", param="name")
        return {"runs": self.runs}

    async def _show(self, cmd: AdminCommand) -> dict[str, Any]:
        self.runs += 1
        return {"runs": self.runs}


async def _answer(widgets: _Widgets, env: Envelope) -> None:
    """What the actor base does: hand the envelope over, answer a GatewayError it raises."""
    try:
        await widgets.area.answer(cast("ActorContext", _Ctx()), env)
    except InvalidRequestError as err:
        await env.respond(err.to_reply())


async def test_the_same_command_sent_again_gets_the_first_answer_and_runs_once() -> None:
    widgets, replies = _Widgets(), _Replies()
    await _answer(widgets, replies.env("first"))
    await _answer(widgets, replies.env("again"))

    assert widgets.runs == 1
    assert replies.to == {
        "first": [AdminReply(result={"runs": 1})],
        "again": [AdminReply(result={"runs": 1})],
    }


async def test_a_refused_command_sent_again_gets_the_same_refusal() -> None:
    widgets, replies = _Widgets(), _Replies()
    widgets.refuse = True
    await _answer(widgets, replies.env("first"))
    await _answer(widgets, replies.env("again"))

    assert widgets.runs == 1
    (first,) = replies.to["first"]
    assert isinstance(first, ErrorReply) and first.message == "no such widget"
    assert replies.to["again"] == [first]


async def test_a_copy_sent_while_the_first_runs_is_answered_when_it_ends() -> None:
    widgets, replies = _Widgets(), _Replies()
    widgets.held = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_answer, widgets, replies.env("first"))
        await anyio.wait_all_tasks_blocked()
        await _answer(widgets, replies.env("again"))  # returns at once: it waits for the first
        assert replies.to == {}
        widgets.held.set()

    assert widgets.runs == 1
    assert replies.to["again"] == replies.to["first"] == [AdminReply(result={"runs": 1})]


@pytest.mark.parametrize(
    ("verb", "request_id"),
    [("get", "r-1"), ("put", "")],
    ids=["a read-only verb", "a command with no id"],
)
async def test_what_changes_nothing_or_has_no_id_runs_again(verb: str, request_id: str) -> None:
    widgets, replies = _Widgets(), _Replies()
    await _answer(widgets, replies.env("first", verb, request_id))
    await _answer(widgets, replies.env("again", verb, request_id))

    assert widgets.runs == 2
    assert replies.to["again"] == [AdminReply(result={"runs": 2})]


async def test_other_request_ids_run_each_and_the_answers_kept_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(actors.admin_once, "ANSWERS_KEPT", 2)
    widgets, replies = _Widgets(), _Replies()
    for n in (1, 2, 3):
        await _answer(widgets, replies.env(f"c{n}", request_id=f"r-{n}"))
    await _answer(widgets, replies.env("c3 again", request_id="r-3"))  # kept
    await _answer(widgets, replies.env("c1 again", request_id="r-1"))  # forgotten: runs

    assert widgets.runs == 4
    assert replies.to["c3 again"] == [AdminReply(result={"runs": 3})]
    assert replies.to["c1 again"] == [AdminReply(result={"runs": 4})]


class _Mailbox:
    """An ActorContext running a check's question in ``tg`` and handing the checked command
    straight back to the area (as the actor's ``handle_local`` does)."""

    def __init__(self, tg: anyio.abc.TaskGroup, area: AdminArea) -> None:
        self.tg, self.area = tg, area

    async def publish(self, subject: str, msg: Message) -> None:
        pass

    def start_soon(self, fn: Any) -> None:
        self.tg.start_soon(fn)

    async def send_self(self, msg: AdminChecked) -> None:
        await self.area.resume(cast("ActorContext", self), msg)


async def test_a_copy_sent_while_the_first_awaits_its_check_is_answered_when_it_runs() -> None:
    runs = 0
    asked = anyio.Event()

    async def put(cmd: AdminCommand) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return {"runs": runs}

    def check(cmd: AdminCommand) -> Any:
        return asked.wait  # the question: answered once ``asked`` is set

    replies = _Replies()
    area = AdminArea("rules", {"put": put}, checks={"put": check})
    async with anyio.create_task_group() as tg:
        ctx = cast("ActorContext", _Mailbox(tg, area))
        await area.answer(ctx, replies.env("first"))
        await area.answer(ctx, replies.env("again"))
        assert replies.to == {}
        asked.set()

    assert runs == 1
    assert replies.to["again"] == replies.to["first"] == [AdminReply(result={"runs": 1})]


async def test_an_answer_kept_past_its_age_is_forgotten_and_the_copy_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(actors.admin_once, "ANSWERS_KEPT_SECONDS", -1.0)  # all already old
    widgets, replies = _Widgets(), _Replies()
    await _answer(widgets, replies.env("first"))
    await _answer(widgets, replies.env("again"))

    assert widgets.runs == 2


async def test_another_verb_under_the_same_request_id_runs() -> None:
    runs: list[str] = []

    async def verb(cmd: AdminCommand, name: str = "") -> dict[str, Any]:
        runs.append(name)
        return {"verb": name}

    async def put(cmd: AdminCommand) -> dict[str, Any]:
        return await verb(cmd, "put")

    async def delete(cmd: AdminCommand) -> dict[str, Any]:
        return await verb(cmd, "delete")

    replies = _Replies()
    area = AdminArea("rules", {"put": put, "delete": delete})
    for name in ("put", "delete"):
        await area.answer(cast("ActorContext", _Ctx()), replies.env(name, name, "r-1"))

    assert runs == ["put", "delete"]
    assert replies.to["delete"] == [AdminReply(result={"verb": "delete"})]


async def test_a_copy_is_answered_and_the_command_audited_when_the_first_answer_is_lost() -> None:
    widgets, replies = _Widgets(), _Replies()
    ctx = _Ctx()

    async def lost(reply: str, msg: Message) -> None:
        raise BusClosedError("the connection's reconnect buffer is full")

    cmd = AdminCommand(by="test", request_id="r-1")
    first = Envelope(subjects.admin("rules", "put"), cmd, "first", lost)
    await widgets.area.answer(cast("ActorContext", ctx), first)  # its answer is not sent
    await widgets.area.answer(cast("ActorContext", ctx), replies.env("again"))

    assert widgets.runs == 1
    assert replies.to["again"] == [AdminReply(result={"runs": 1})]
    assert [(e.verb, e.ok) for e in ctx.published if isinstance(e, AdminExecuted)] == [
        ("put", True)
    ]
