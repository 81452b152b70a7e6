"""ApiKeyAdminActor: the one owner of the gateway API keys (the ``api_keys`` table).

Ingresses never open the table; they ask this actor over the bus and cache its answers:

- ``llmgw.auth.keys.lookup``: ApiKeyLookup (a key's sha256 hex) -> ApiKeyInfo (role, org,
  user, key id, expiry, revocation; ``found=False`` for an unknown hash). Never the key.
- ``llmgw.auth.state.get``: AuthStateRequest -> AuthState (whether any key exists: auth is on);
  the same AuthState is published on ``llmgw.auth.state`` at start and when the first key is
  created.

Admin verbs on ``llmgw.admin.api_keys.<verb>``:

- ``list`` (read only): every key's row (never the key or its hash), oldest first.
- ``create`` {org, user, role, name?, expires_in? | expires_at?}: a new key; the answer is the
  only place the key itself ever appears.
- ``revoke`` {id}: revoke a key by its ``gk-…`` id (or by the key itself); the row stays.

Every change is announced on ``llmgw.auth.keys.changed`` (``ApiKeyCreated`` /
``ApiKeyRevoked``, by hash) before the answer, so every ingress drops its cached entry.
``llmgw keys`` sends these same commands when a gateway answers; only with no gateway running
(the first admin key needs one) does it write the table itself (``gateway.cli.keys``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea, role_arg, stored, text_arg
from actors.base import Actor, ActorContext, Serve
from actors.stores.api_keys import (
    API_KEYS,
    ApiKeys,
    ApiKeyStore,
    parse_duration,
    parse_instant,
)
from actors.stores.api_keys_snapshot import SnapshotApiKeyStore
from actors.stores.provider_keys import LazyDb
from schemas import (
    AdminCommand,
    ApiKeyCreated,
    ApiKeyInfo,
    ApiKeyLookup,
    ApiKeyRevoked,
    AuthState,
    AuthStateRequest,
    InvalidRequestError,
    RouteNotFoundError,
    subjects,
)
from schemas.keys import expiry_problem
from schemas.limits import key_owner_problem

if TYPE_CHECKING:
    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope

_WHAT = "gateway API key"


def _expiry(cmd: AdminCommand, now: float) -> float | None:
    """Unix seconds from ``expires_in`` (a duration) or ``expires_at`` (a time); None: never.
    Raises InvalidRequestError for both, or a bad one."""
    given = [name for name in ("expires_in", "expires_at") if name in cmd.args]
    if len(given) > 1:
        raise InvalidRequestError("give one of 'expires_in' and 'expires_at'", param=given[1])
    for name in given:
        try:
            if name == "expires_in":
                expires = now + parse_duration(cmd.args[name])
            else:
                expires = parse_instant(cmd.args[name])
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"bad '{name}': {exc}", param=name) from None
        problem = expiry_problem(expires, now)
        if problem is not None:
            raise InvalidRequestError(f"bad '{name}': {problem}", param=name)
        return expires
    return None


_CREATE_ARGS = frozenset({"org", "user", "role", "name", "expires_in", "expires_at"})
_LIMIT_ARGS = frozenset({"rpm", "tpm", "concurrency", "budget", "budget_usd", "budget_period"})


def _refuse_unknown(cmd: AdminCommand) -> None:
    """Raise InvalidRequestError for an argument ``create`` does not take: one silently
    dropped (a limit above all) reads as set when it is not."""
    unknown = sorted(set(cmd.args) - _CREATE_ARGS)
    if not unknown:
        return
    first = unknown[0]
    if first in _LIMIT_ARGS:
        raise InvalidRequestError(
            f"'{first}' is a limit, not a key's field: set it with PUT /admin/limits/key/{{id}} "
            "once the key exists (or llmgw keys create --rpm ...)",
            param=first,
        )
    raise InvalidRequestError(
        f"'{first}' is not an argument of create (it takes {', '.join(sorted(_CREATE_ARGS))})",
        param=first,
    )


class ApiKeyAdminActor(Actor):
    """Owns the gateway API keys: answers key lookups, the auth state and the ``api_keys``
    admin area. A database failure refuses the lookup or command (GatewayError); nothing is
    announced for a change not made. With ``state`` (a cluster: the unit's snapshots in
    JetStream) the keys live there instead of the SQLite file, so the host that takes this
    one over knows every key (``stores.api_keys_snapshot``)."""

    def __init__(self, db_path: str, *, state: SnapshotStore | None = None) -> None:
        self.name = "api_keys"
        self._db_path = db_path
        self._shared = state
        self.admin = AdminArea(
            "api_keys",
            {
                "list": self._list,
                "create": self._create,
                "revoke": self._revoke,
            },
            args={"list": frozenset(), "revoke": frozenset({"id"})},
        )
        self.serves = (
            Serve(subjects.AUTH_KEYS_LOOKUP),
            Serve(subjects.AUTH_STATE_GET),
            self.admin.serve,
        )
        self._any_keys = False

    async def on_start(self, ctx: ActorContext) -> None:
        """Announce whether auth is on; the file is created only on the first key."""
        self.ctx = ctx
        self._store: ApiKeys = (
            ApiKeyStore(LazyDb(self._db_path, [API_KEYS]))
            if self._shared is None
            else SnapshotApiKeyStore(self._shared)
        )
        self._any_keys = await self._store.any_keys()
        await ctx.publish(subjects.AUTH_STATE, AuthState(any_keys=self._any_keys))

    async def on_stop(self) -> None:
        """Close the database."""
        await self._store.aclose()

    async def handle(self, env: Envelope) -> None:
        """Key lookups, the auth state, and admin commands of area ``api_keys``."""
        match env.message:
            case ApiKeyLookup(key_hash=key_hash, key_id=key_id):
                found = self._store.lookup_id(key_id) if key_id else self._store.lookup(key_hash)
                record = await stored(found, _WHAT)
                await env.respond(record.info() if record is not None else ApiKeyInfo(found=False))
            case AuthStateRequest():
                if not self._any_keys:  # a key written by ``llmgw keys`` with no gateway up
                    self._any_keys = await stored(self._store.any_keys(), _WHAT)
                await env.respond(AuthState(any_keys=self._any_keys))
            case _ if self.admin.owns(env):
                await self.admin.answer(self.ctx, env)

    async def _list(self, cmd: AdminCommand) -> dict[str, Any]:
        now = time.time()
        return {"data": [r.public(now) for r in await stored(self._store.records(), _WHAT)]}

    async def _create(self, cmd: AdminCommand) -> dict[str, Any]:
        _refuse_unknown(cmd)
        org, user = text_arg(cmd, "org"), text_arg(cmd, "user")
        problem = key_owner_problem(org, user)
        if problem is not None:
            raise InvalidRequestError(problem[1], param=problem[0])
        name = text_arg(cmd, "name", required=False)
        role = role_arg(cmd, "role")
        now = time.time()
        key, record = await stored(
            self._store.create(
                org=org, user=user, role=role, name=name, expires=_expiry(cmd, now), now=now
            ),
            _WHAT,
        )
        await self.ctx.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyCreated(key_hash=record.key_hash))
        if not self._any_keys:
            self._any_keys = True
            await self.ctx.publish(subjects.AUTH_STATE, AuthState(any_keys=True))
        return {**record.public(now), "key": key}

    async def _revoke(self, cmd: AdminCommand) -> dict[str, Any]:
        ref = text_arg(cmd, "id")
        now = time.time()
        record = await stored(self._store.revoke(ref, now), _WHAT)
        if record is None:
            raise RouteNotFoundError(
                "no gateway API key "
                + ("with that value" if ref.startswith("llmgw-") else repr(ref))
            )
        await self.ctx.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyRevoked(key_hash=record.key_hash))
        return record.public(now)
