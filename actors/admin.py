"""Admin commands, owner side: an actor that owns an area's state answers its verbs.

Every admin action is an ``AdminCommand`` on ``llmgw.admin.<area>.<verb>``. The one actor
owning ``<area>`` puts ``area.serve`` in its ``serves`` and hands matching envelopes to
:meth:`AdminArea.answer`, which runs the verb's handler, replies ``AdminReply`` (or
``ErrorReply`` for a GatewayError) and, for verbs that change state (all but the area's
``schemas.READ_ONLY_ADMIN_VERBS``), publishes an ``AdminExecuted`` audit event on
``llmgw.events.admin``::

    self.admin = AdminArea("config", {"reload": self._reload, "show": self._show})
    self.serves = (self.admin.serve, ...)
    ...
    if self.admin.owns(env):
        await self.admin.answer(self.ctx, env)

A verb that must ask another actor before it may run (does this key exist?) names a check
(``checks={"set": self._check_set}``): the check runs in the mailbox and returns the question,
which is asked off the mailbox (``ctx.start_soon``), so the owner's other messages are not
held behind another actor's answer; the verb then runs in the mailbox, handed back as an
``AdminChecked`` the actor passes from ``handle_local`` to :meth:`AdminArea.resume`.

A state-changing command runs once per verb and ``request_id`` (``actors.admin_once``): the
same command sent again (its sender lost the connection its answer went to, and asks again
once back) is answered with the first one's answer, or, while that one still runs, with it
when it ends.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from actors.admin_once import CommandKey, RunOnce
from actors.base import Serve
from actors.stores.db import SharedDatabaseError
from schemas import (
    AdminCommand,
    AdminExecuted,
    AdminReply,
    ErrorReply,
    GatewayError,
    InvalidRequestError,
    NoRespondersError,
    is_read_only_admin_verb,
    subjects,
)
from schemas.keys import ROLES
from schemas.names import SECRET_MAX_CHARS, checked_text

if TYPE_CHECKING:
    from actors.base import ActorContext
    from bus import Envelope

logger = logging.getLogger(__name__)

AdminHandler = Callable[[AdminCommand], Awaitable[dict[str, Any]]]
MAX_CHECKS_IN_FLIGHT = 64
"""An area's commands whose check's question may be out at once; more are refused."""

AdminQuestion = Callable[[], Awaitable[None]]
AdminCheck = Callable[[AdminCommand], AdminQuestion | None]
"""A verb's check: runs in the mailbox (it may read the owner's state and raise GatewayError
to refuse) and returns the question to await off the mailbox (raising GatewayError to
refuse), or None when there is nothing to ask."""
_T = TypeVar("_T")
_SENDER_LOGS = frozenset({"sighup"})
"""Senders (``AdminCommand.by``) that log a command's outcome themselves, where the operator
looks: nobody else is told of a SIGHUP's reload. Their commands are audited by the event
alone, so a reload refused on SIGHUP is logged once, not once here and once there."""
_FAILED = GatewayError("the admin command failed in its owner (logged there)").to_reply()
"""What the copies of a command that failed with a bug are told (not kept: sent again, a copy
runs)."""


REFUSAL_MAX_CHARS = 512
"""Longest refusal (its message, its ``param``) an admin command answers, logs and audits: a
check may quote what it refuses, which may be a 100,000-character argument name."""


def _bounded(err: GatewayError) -> None:
    """Cut ``err``'s message and ``param`` to :data:`REFUSAL_MAX_CHARS` (in place)."""
    if len(err.message) > REFUSAL_MAX_CHARS:
        err.message = err.message[:REFUSAL_MAX_CHARS] + "..."
    param = getattr(err, "param", None)
    if isinstance(param, str) and len(param) > REFUSAL_MAX_CHARS:
        err.param = param[:REFUSAL_MAX_CHARS] + "..."  # type: ignore[attr-defined]


TEXT_ARG_MAX_CHARS = 256
"""Longest name or id an admin argument may be: every one is echoed in lists, logs, events
and errors, so none may be a 10,000-character line."""
SECRET_ARG_MAX_CHARS = SECRET_MAX_CHARS
"""Longest upstream secret or URL an argument may be (``schemas.names.SECRET_MAX_CHARS``)."""


def text_arg(
    cmd: AdminCommand, name: str, *, required: bool = True, max_chars: int = TEXT_ARG_MAX_CHARS
) -> str:
    """Argument ``name`` as a stripped non-empty string ("" when absent and not required), of
    at most ``max_chars`` printable characters. Raises InvalidRequestError naming it (never
    quoting the value, which may be a secret)."""
    value = cmd.args.get(name)
    if value is None and not required:
        return ""
    return checked_text(value, name, max_chars)


def number_arg(cmd: AdminCommand, name: str, *, low: float, high: float) -> float:
    """Argument ``name`` as a number from ``low`` to ``high`` (so never NaN, an infinity or an
    integer too large for a float). Raises InvalidRequestError naming it."""
    value = cmd.args.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be a number from {low:g} to {high:g}", param=name)
    return float(value)


def role_arg(cmd: AdminCommand, name: str, default: str | None = None) -> str:
    """Argument ``name`` as a role (``free`` ... ``admin``). Raises InvalidRequestError."""
    value = cmd.args.get(name, default)
    if value not in ROLES:
        raise InvalidRequestError(f"'{name}' must be one of {', '.join(ROLES)}", param=name)
    return str(value)


async def stored(op: Awaitable[_T], what: str) -> _T:
    """Await a database call; a failing file refuses the command with a GatewayError naming
    ``what`` (the state stays as it was: SQLite rolled the statement back)."""
    try:
        return await op
    except (sqlite3.Error, SharedDatabaseError) as exc:
        raise GatewayError(f"the {what} database failed: {exc}") from None


def refuse_undeclared(area: str, verb: str, args: Mapping[str, Any], taken: frozenset[str]) -> None:
    """Raise InvalidRequestError naming the first argument of ``args`` not in ``taken``:
    refused, not dropped, as a misspelt argument (``budgt``, ``min-role``) would read as
    applied when it is not. What an area's ``args`` enforce, and a reader that answers for
    the owner (``llmgw admin spend report`` offline) enforces alike."""
    if unknown := sorted(set(args) - taken):
        name = unknown[0][:TEXT_ARG_MAX_CHARS]
        raise InvalidRequestError(
            f"{area} {verb} takes no argument {name!r} (it takes {', '.join(sorted(taken))})",
            param=name,
        )


@dataclass(frozen=True, slots=True)
class AdminChecked:
    """Local message: a command whose check passed, to run in the mailbox."""

    env: Envelope


class AdminArea:
    """Routes one admin area's verbs to handlers; owns nothing but that table.

    A handler returns the reply's ``result`` (JSON-able, never a secret) and raises a
    GatewayError (``InvalidRequestError`` for bad arguments) to refuse. A verb listed in
    ``args`` is refused any argument not in its set, before its check or handler runs.
    """

    def __init__(
        self,
        area: str,
        verbs: Mapping[str, AdminHandler],
        *,
        checks: Mapping[str, AdminCheck] | None = None,
        args: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.area = area
        self._verbs = dict(verbs)
        self._checks = dict(checks or {})
        self._args = dict(args or {})
        self._asking = 0  # checks whose question is out
        self._once = RunOnce()
        if unknown := set(self._checks) - set(self._verbs):
            raise ValueError(f"admin area {area!r}: checks for no verb: {sorted(unknown)}")
        if unknown := set(self._args) - set(self._verbs):
            raise ValueError(f"admin area {area!r}: args for no verb: {sorted(unknown)}")
        self.serve = Serve(subjects.admin_area(area))

    @property
    def verbs(self) -> tuple[str, ...]:
        """The verbs this area answers, sorted."""
        return tuple(sorted(self._verbs))

    def owns(self, env: Envelope) -> bool:
        """True for an AdminCommand addressed to this area."""
        if not isinstance(env.message, AdminCommand):
            return False
        try:
            area, _ = subjects.admin_parts(env.subject)
        except ValueError:
            return False
        return area == self.area

    async def answer(self, ctx: ActorContext, env: Envelope) -> None:
        """Run the verb and reply, or start its check's question and reply once answered.
        Raises GatewayError (answered as ErrorReply by the actor base) for an unknown verb or
        a refused command."""
        cmd, verb, handler = self._command(env)
        key = self._key(verb, cmd)
        if key is not None and await self._once.seen(key, env):
            return  # a copy: answered, or to be when the command it copies ends
        check = self._checks.get(verb)
        try:
            question = check(cmd) if check is not None else None
        except Exception as exc:
            await self._failed(ctx, verb, cmd, key, exc)
            raise
        if question is None:
            await self._run(ctx, env, verb, cmd, handler)
        elif self._asking >= MAX_CHECKS_IN_FLIGHT:  # a bound on the tasks, as on any set
            refusal = NoRespondersError(
                f"the {self.area} owner has {self._asking} admin commands waiting on their "
                "checks: retry in a moment"
            )
            await self._end(key, refusal.to_reply(), keep=False)  # not run: sent again, it may
            raise refusal
        else:
            self._asking += 1
            ctx.start_soon(partial(self._ask, ctx, env, verb, cmd, question))

    async def resume(self, ctx: ActorContext, checked: AdminChecked) -> None:
        """Run a checked command's verb and reply (a refusal too: ``handle_local`` answers
        no one). Raises what the verb raises other than GatewayError, and ValueError for a
        command of another area (an actor with two areas hands each back to its own)."""
        if not self.owns(checked.env):
            raise ValueError(f"admin area {self.area!r} was handed {checked.env.subject!r}")
        cmd, verb, handler = self._command(checked.env)
        try:
            await self._run(ctx, checked.env, verb, cmd, handler)
        except GatewayError as err:
            await checked.env.respond(err.to_reply())

    def _command(self, env: Envelope) -> tuple[AdminCommand, str, AdminHandler]:
        cmd = env.message
        assert isinstance(cmd, AdminCommand)
        _, verb = subjects.admin_parts(env.subject)
        handler = self._verbs.get(verb)
        if handler is None:
            raise InvalidRequestError(
                f"unknown admin command {self.area!r} {verb!r}; "
                f"known: {', '.join(self.verbs) or 'none'}"
            )
        taken = self._args.get(verb)
        if taken is not None:
            refuse_undeclared(self.area, verb, cmd.args, taken)
        return cmd, verb, handler

    def _key(self, verb: str, cmd: AdminCommand) -> CommandKey | None:
        """What a command runs once under: None for a read-only verb (it just runs again)
        and for a command with no request id."""
        if not cmd.request_id or is_read_only_admin_verb(self.area, verb):
            return None
        return verb, cmd.request_id

    async def _end(
        self, key: CommandKey | None, answer: AdminReply | ErrorReply, *, keep: bool
    ) -> None:
        if key is not None:
            await self._once.end(key, answer, keep=keep)

    async def _failed(
        self,
        ctx: ActorContext,
        verb: str,
        cmd: AdminCommand,
        key: CommandKey | None,
        exc: Exception,
    ) -> None:
        """A command ended by ``exc`` before its answer: a refusal (a GatewayError) is
        audited and kept for its copies; after a bug its copies are told, and a copy sent
        later runs again."""
        if isinstance(exc, GatewayError):
            _bounded(exc)
            await self._refused(ctx, verb, cmd, exc)
            await self._end(key, exc.to_reply(), keep=True)
        else:
            await self._end(key, _FAILED, keep=False)

    async def _run(
        self, ctx: ActorContext, env: Envelope, verb: str, cmd: AdminCommand, handler: AdminHandler
    ) -> None:
        key = self._key(verb, cmd)
        try:
            result = await handler(cmd)
        except Exception as exc:
            await self._failed(ctx, verb, cmd, key, exc)
            raise
        answer = AdminReply(result=result)
        # Kept, and the copies answered, before the reply that may fail (a connection lost).
        await self._end(key, answer, keep=True)
        try:
            await env.respond(answer)
        except GatewayError as exc:
            logger.warning("admin %s %s: answer not sent: %s", self.area, verb, exc.message)
        if not is_read_only_admin_verb(self.area, verb):
            await self._audit(ctx, verb, cmd, ok=True)

    async def _ask(
        self,
        ctx: ActorContext,
        env: Envelope,
        verb: str,
        cmd: AdminCommand,
        question: AdminQuestion,
    ) -> None:
        # Off the mailbox: it touches no state, and only hands the command back to it.
        key = self._key(verb, cmd)
        try:
            await question()
        except GatewayError as err:
            self._asking -= 1
            await self._failed(ctx, verb, cmd, key, err)
            await env.respond(err.to_reply())
            return
        except anyio.get_cancelled_exc_class():
            # The owner is stopping (a reload, a restart, a unit moving): nothing was written,
            # so say so now rather than leave the caller to its timeout's "outcome unknown".
            stopping = NoRespondersError(
                f"the {self.area} owner stopped before running {verb}: nothing was changed; retry"
            ).to_reply()
            copies = self._once.abandon(key) if key is not None else []
            with anyio.CancelScope(shield=True):
                for waiting in [env, *copies]:
                    await waiting.respond(stopping)
            raise
        self._asking -= 1
        await ctx.send_self(AdminChecked(env))

    async def _refused(
        self, ctx: ActorContext, verb: str, cmd: AdminCommand, err: GatewayError
    ) -> None:
        if not is_read_only_admin_verb(self.area, verb):
            await self._audit(ctx, verb, cmd, ok=False, message=err.message)

    async def _audit(
        self, ctx: ActorContext, verb: str, cmd: AdminCommand, *, ok: bool, message: str = ""
    ) -> None:
        if cmd.by not in _SENDER_LOGS:
            logger.info(
                "admin %s %s by %s (%s): %s%s",
                self.area,
                verb,
                cmd.by or "?",
                cmd.request_id or "no request id",
                "ok" if ok else "refused",
                f" ({message})" if message else "",
            )
        event = AdminExecuted(
            area=self.area,
            verb=verb,
            by=cmd.by,
            ok=ok,
            message=message,
            ts=time.time(),
            request_id=cmd.request_id,
        )
        try:
            await ctx.publish(subjects.event("admin"), event)
        except GatewayError as exc:  # the command happened; a lost audit event must not undo it
            logger.warning("admin audit event not published: %s", exc)
