"""RulesActor: owns the routing rule set; admin area ``rules``.

The set is persisted as this actor's snapshot and published as ``RulesState`` on
``llmgw.rules.state`` on every change; every ingress holds it compiled (a get on start, then
these events) and evaluates it locally, so a rule costs no bus round trip per request.

Verbs on ``llmgw.admin.rules.<verb>``:

- ``get`` (read only): the set, its status and version.
- ``put`` {rules: [...]}: replace the whole set atomically. An invalid set is refused with
  the path of its first problem (``rules[3].when.$and[1].metadata.team.$regex: ...``) and
  changes nothing.
- ``validate`` {rules: [...]} (read only): check a set without storing it.

A stored set that no longer reads (a corrupt snapshot, or one the language now refuses),
found at start or when the config is reloaded, is *disabled*: the state says so with the
reason, an event on ``llmgw.events.rules`` tells operators, and routing goes on without
rules until a valid set is put.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from actors.admin import AdminArea, stored
from actors.base import Actor, ActorContext, Serve
from schemas import AdminCommand, ConfigChanged, GatewayError, RulesGet, RulesState, subjects
from schemas.rule_language import RuleSetError, compile_rules, parse_rule_set
from schemas.rules import StoredRules

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope

logger = logging.getLogger(__name__)

SNAPSHOT_NAME = "rules"


def state_json(state: RulesState) -> dict[str, Any]:
    """The JSON form admins read (``get``, ``put``, ``GET /api/fallback/routing-rules``)."""
    return {
        "rules": [msgspec.to_builtins(r) for r in state.rules],
        "status": state.status,
        "reason": state.reason,
        "version": state.version,
        "updated": state.updated,
    }


class RulesActor(Actor):
    """Owns the routing rule set: validates, persists, publishes, answers gets."""

    def __init__(
        self, *, snapshots: SnapshotStore | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.name = "rules"
        self._snapshots = snapshots
        self._clock = clock
        self.admin = AdminArea(
            "rules", {"get": self._get, "put": self._put, "validate": self._validate}
        )
        self.serves = (
            self.admin.serve,
            Serve(subjects.RULES_GET),
            Serve(subjects.event("config")),
        )
        self._state = RulesState()

    async def on_start(self, ctx: ActorContext) -> None:
        """Load the stored set (a set that does not read is disabled) and publish it."""
        self.ctx = ctx
        self._state = await self._read()
        await self._publish()  # an ingress that started first learns the set now

    async def handle(self, env: Envelope) -> None:
        """Gets, admin commands, and config reloads (re-read the stored set)."""
        match env.message:
            case RulesGet():
                await env.respond(self._state)
            case ConfigChanged():
                await self._reload()
            case AdminCommand() if self.admin.owns(env):
                await self.admin.answer(self.ctx, env)

    async def _reload(self) -> None:
        old = self._state
        self._state = await self._read()
        if self._state != old:
            await self._publish()

    async def _read(self) -> RulesState:
        if self._snapshots is None:
            return self._state
        raw = await self._snapshots.load(SNAPSHOT_NAME)
        if raw is None:
            return RulesState()
        try:
            snap = msgspec.json.decode(raw, type=StoredRules)
            compile_rules(snap.rules)
        except (msgspec.DecodeError, RuleSetError) as exc:
            reason = f"the stored rule set does not read ({exc}); routing goes on without rules"
            logger.error("routing rules disabled: %s", reason)
            return RulesState(status="disabled", reason=reason)
        return RulesState(rules=snap.rules, version=snap.version, updated=snap.updated)

    async def _publish(self) -> None:
        await self.ctx.publish(subjects.RULES_STATE, self._state)
        if self._state.status == "disabled":
            try:
                await self.ctx.publish(subjects.event("rules"), self._state)
            except GatewayError as exc:  # the state is published; the alert is best effort
                logger.warning("rules event not published: %s", exc)

    async def _get(self, cmd: AdminCommand) -> dict[str, Any]:
        return state_json(self._state)

    async def _validate(self, cmd: AdminCommand) -> dict[str, Any]:
        compiled = compile_rules(parse_rule_set(cmd.args))
        return {"valid": True, "rules": len(compiled.rules)}

    async def _put(self, cmd: AdminCommand) -> dict[str, Any]:
        rules = parse_rule_set(cmd.args)
        compile_rules(rules)  # refuses with the path; nothing is stored
        now = self._clock()
        version = self._state.version + 1
        snap = StoredRules(rules=rules, version=version, updated=now)
        if self._snapshots is not None:
            await stored(
                self._snapshots.save(SNAPSHOT_NAME, msgspec.json.encode(snap), now, durable=True),
                "routing rules",
            )
        self._state = RulesState(rules=rules, version=version, updated=now)
        await self._publish()
        return state_json(self._state)
