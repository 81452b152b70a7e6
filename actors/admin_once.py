"""One run per admin command: the book an ``AdminArea`` keeps so that the same state-changing
command sent again (its sender lost the connection its answer went to, and asks again once
back: ``gateway.admin.http.admin_request``) is answered, not run twice.

A command is known by its verb and its ``request_id``. The book holds the answers of the
area's last commands for :data:`ANSWERS_KEPT_SECONDS` (at most :data:`ANSWERS_KEPT`), and the
copies that arrived while one still ran, which get its answer when it ends. It is the area's
own, so it holds within one owner: a copy that reaches another owner (a restarted actor, a
unit moved to another host, a queue group's other member) runs there.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from schemas import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Envelope
    from schemas import AdminReply, ErrorReply

logger = logging.getLogger(__name__)

ANSWERS_KEPT = 256
"""Answers an area keeps at most."""
ANSWERS_KEPT_SECONDS = 120.0
"""How long an answer is kept: a sender asks again within its own timeout (30 s) and the
reconnect grace, so this covers it with room; a copy later than that runs again."""

CommandKey = tuple[str, str]
"""(verb, request id)."""


class RunOnce:
    """Owns one area's kept answers and the copies waiting on a command still running."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._answered: OrderedDict[CommandKey, tuple[float, AdminReply | ErrorReply]] = (
            OrderedDict()
        )
        self._running: dict[CommandKey, list[Envelope]] = {}

    @property
    def running(self) -> int:
        """Commands begun and not yet ended."""
        return len(self._running)

    async def seen(self, key: CommandKey, env: Envelope) -> bool:
        """Whether ``env`` is a copy of a command already run (answered now, with its answer)
        or still running (answered when it ends); else the command begins under ``key``.
        Raises GatewayError when the answer cannot be sent."""
        self._forget_old()
        kept = self._answered.get(key)
        if kept is not None:
            await env.respond(kept[1])
            return True
        copies = self._running.get(key)
        if copies is not None:
            copies.append(env)
            return True
        self._running[key] = []
        return False

    async def end(self, key: CommandKey, answer: AdminReply | ErrorReply, *, keep: bool) -> None:
        """The command begun under ``key`` ended with ``answer``: each copy waiting gets it,
        and it is kept for the copies to come (``keep``: else a copy runs again, as after a
        command that changed nothing). Ending twice does nothing the second time."""
        copies = self._running.pop(key, None)
        if copies is None:
            return
        if keep:
            self._answered[key] = (self._clock(), answer)
            if len(self._answered) > ANSWERS_KEPT:
                self._answered.popitem(last=False)
        for copy in copies:
            try:
                await copy.respond(answer)
            except GatewayError as exc:  # its sender's connection: the others still get theirs
                logger.warning("admin answer to a copy of %s not sent: %s", key[0], exc)

    def abandon(self, key: CommandKey) -> list[Envelope]:
        """End the command begun under ``key`` with no answer kept; the copies waiting on it,
        for the caller to answer."""
        return self._running.pop(key, [])

    def _forget_old(self) -> None:
        oldest = self._clock() - ANSWERS_KEPT_SECONDS
        answered = self._answered
        while answered and next(iter(answered.values()))[0] < oldest:
            answered.popitem(last=False)
