"""ApiKeyAdminActor: owns changes to the gateway API keys; admin area ``api_keys``.

Verbs on ``llmgw.admin.api_keys.<verb>``:

- ``list`` (read only): every key's row (never the key or its hash), oldest first.
- ``create`` {org, user, role, name?, expires_in? | expires_at?}: a new key; the answer is the
  only place the key itself ever appears.
- ``revoke`` {id}: revoke a key by its ``gk-…`` id (or by the key itself); the row stays.

Every change is announced on ``llmgw.auth.keys.changed`` (``ApiKeyCreated`` /
``ApiKeyRevoked``, by hash) before the answer, so every ingress drops its cached entry.
``llmgw keys`` writes the same table directly (it works with no gateway running, which the
first admin key needs) and announces on the bus the same way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea, role_arg, stored, text_arg
from actors.apikeys import API_KEYS, ApiKeyStore, parse_duration, parse_instant
from actors.base import Actor, ActorContext
from actors.keystore import LazyDb
from schemas import (
    AdminCommand,
    ApiKeyCreated,
    ApiKeyRevoked,
    InvalidRequestError,
    RouteNotFoundError,
    subjects,
)

if TYPE_CHECKING:
    from bus import Envelope

_WHAT = "gateway API key"


def _expiry(cmd: AdminCommand, now: float) -> float | None:
    """Unix seconds from ``expires_in`` (a duration) or ``expires_at`` (a time); None: never."""
    for name in ("expires_in", "expires_at"):
        if name not in cmd.args:
            continue
        try:
            if name == "expires_in":
                return now + parse_duration(cmd.args[name])
            return parse_instant(cmd.args[name])
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"bad '{name}': {exc}", param=name) from None
    return None


class ApiKeyAdminActor(Actor):
    """Answers the ``api_keys`` admin area from the shared database file. A database failure
    refuses the command (GatewayError); nothing is announced for a change not made."""

    def __init__(self, db_path: str) -> None:
        self.name = "api_keys"
        self._db_path = db_path
        self.admin = AdminArea("api_keys", {
            "list": self._list, "create": self._create, "revoke": self._revoke,
        }, read_only=("list",))
        self.serves = (self.admin.serve,)

    async def on_start(self, ctx: ActorContext) -> None:
        """Open nothing yet: the file is created on the first key."""
        self.ctx = ctx
        self._store = ApiKeyStore(LazyDb(self._db_path, [API_KEYS]))

    async def on_stop(self) -> None:
        """Close the database."""
        await self._store.db.aclose()

    async def handle(self, env: Envelope) -> None:
        """Admin commands of area ``api_keys``."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)

    async def _list(self, cmd: AdminCommand) -> dict[str, Any]:
        now = time.time()
        return {"data": [r.public(now) for r in await stored(self._store.records(), _WHAT)]}

    async def _create(self, cmd: AdminCommand) -> dict[str, Any]:
        org, user = text_arg(cmd, "org"), text_arg(cmd, "user")
        name = text_arg(cmd, "name", required=False)
        role = role_arg(cmd, "role")
        now = time.time()
        key, record = await stored(self._store.create(
            org=org, user=user, role=role, name=name, expires=_expiry(cmd, now), now=now), _WHAT)
        await self.ctx.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyCreated(key_hash=record.key_hash))
        return {**record.public(now), "key": key}

    async def _revoke(self, cmd: AdminCommand) -> dict[str, Any]:
        ref = text_arg(cmd, "id")
        now = time.time()
        record = await stored(self._store.revoke(ref, now), _WHAT)
        if record is None:
            raise RouteNotFoundError("no gateway API key " + (
                "with that value" if ref.startswith("llmgw-") else repr(ref)))
        await self.ctx.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyRevoked(key_hash=record.key_hash))
        return record.public(now)

