"""KeyRegistryActor: owns the provider-key declarations and the admin area ``provider_keys``.

What it owns: the database-added provider keys and the reservations by hash (the SQLite
file's ``provider_api_keys`` and ``provider_env_key_min_roles``; in a cluster, the same tables
in the PostgreSQL database every actors host shares, so the host that takes the ``keys``
unit over knows every key), merged with the most
restrictive configured tier of every credential, as ``KeyDeclarations``. It loads them at
start and publishes them on ``llmgw.keys.registry.declarations`` (every KeyPoolActor and
ingress follows that subject) after every change.

Admin area ``provider_keys`` (``llmgw.admin.provider_keys.<verb>``, spec "Reserving upstream
keys for a tier"):

- ``list`` (read only): database keys, configured keys with their effective tier, and
  reservations, flagging those that point at no configured key.
- ``add`` {key, endpoint | base_url, min_role?}: store a key; it joins the pools of one
  endpoint id or of every route with that base URL, after the configured keys.
- ``set_min_role`` {id, min_role} · ``delete`` {id}: change or remove a database key.
- ``reserve`` {key | credential_id, min_role}: reserve an environment or config key for a
  tier and above by its hash (``free`` lifts the reservation).
- ``reload``: re-read the database (changed behind the gateway's back) and apply what it holds.

Ingresses never open the file: ``llmgw.keys.registry.secret`` (ProviderSecretRequest ->
ProviderSecretGrant) answers the secret of one database key by credential id, valid for
``SECRET_GRANT_TTL_S`` (then the ingress asks again); NATS lets only ingress and actors
credentials ask (compose.yaml), and the answer travels on the asker's inbox.

A change is answered once every pool has applied it (bounded by ``apply_timeout``; the
answer's ``pending_pools`` names any that had not). Besides a grant, the ``key`` argument is
the one place a secret crosses the bus: only on the admin subject, which NATS restricts to
admin credentials (compose.yaml). No admin answer, log line or event carries it: keys appear
as ``k-…`` ids.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from actors.admin import SECRET_ARG_MAX_CHARS, AdminArea, role_arg, stored, text_arg
from actors.base import Actor, ActorContext, Serve
from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore
from schemas import (
    AdminCommand,
    InvalidRequestError,
    KeyDeclarations,
    KeyDeclarationsRequest,
    KeyPoolState,
    ProviderKeyDecl,
    ProviderSecretGrant,
    ProviderSecretRequest,
    RouteNotFoundError,
    subjects,
)
from schemas.config import credential_id
from schemas.keys import most_restrictive

if TYPE_CHECKING:
    from actors.stores.provider_keys_postgres import PostgresProviderKeyStore
    from bus import Envelope

logger = logging.getLogger(__name__)

_WHAT = "provider key"
SECRET_GRANT_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class PoolRoute:
    """What the registry knows of one pool (an endpoint id): no secrets, only ids."""

    endpoint: str
    base_url: str
    credential_ids: tuple[str, ...] = ()


def _public(decl: ProviderKeyDecl) -> dict[str, Any]:
    return {
        "id": decl.key_id,
        "credential_id": decl.credential_id,
        "endpoint": decl.endpoint,
        "base_url": decl.base_url,
        "min_role": decl.min_role,
        "created": decl.created,
    }


class KeyRegistryActor(Actor):
    """Owns the provider-key declarations beyond each route's own and answers the
    ``provider_keys`` admin area. A database that fails at start crashes it (its supervisor
    decides); one that fails later refuses the command (GatewayError) and keeps the last
    declarations."""

    def __init__(
        self,
        db_path: str,
        configured_roles: tuple[tuple[str, str], ...] = (),
        pools: tuple[PoolRoute, ...] = (),
        *,
        apply_timeout: float = 5.0,
        shared_url: str | None = None,
    ) -> None:
        self.name = "keys:registry"
        self._db_path = db_path
        self._shared_url = shared_url
        self._configured_roles = configured_roles
        self._pools = pools
        self._apply_timeout = apply_timeout
        self.admin = AdminArea(
            "provider_keys",
            {
                "list": self._list,
                "add": self._add,
                "set_min_role": self._set_min_role,
                "delete": self._delete,
                "reserve": self._reserve,
                "reload": self._reload,
            },
            args={
                "add": frozenset({"key", "endpoint", "base_url", "min_role"}),
                "set_min_role": frozenset({"id", "min_role"}),
                "delete": frozenset({"id"}),
                "reserve": frozenset({"key", "credential_id", "min_role"}),
            },
        )
        self.serves = (
            Serve(subjects.KEYS_REGISTRY_GET),
            Serve(subjects.KEYS_SECRET_GRANT),
            self.admin.serve,
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Load the declarations and announce them."""
        self.ctx = ctx
        self._store = self._open_store()
        self._decls = KeyDeclarations()
        db_keys, reservations = await self._store.declarations()
        await self._publish(db_keys, reservations)

    def _open_store(self) -> ProviderKeyStore | PostgresProviderKeyStore:
        if self._shared_url is None:
            return ProviderKeyStore(LazyDb(self._db_path, [PROVIDER_KEYS]))
        # Imported here only: asyncpg is needed by deployments that configure PostgreSQL.
        from actors.stores.provider_keys_postgres import PostgresProviderKeyStore

        return PostgresProviderKeyStore(self._shared_url)

    async def on_stop(self) -> None:
        """Close the database."""
        await self._store.aclose()

    async def handle(self, env: Envelope) -> None:
        """Answer the current declarations, a secret grant, or an admin command."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)
        elif isinstance(env.message, KeyDeclarationsRequest):
            await env.respond(self._decls)
        elif isinstance(env.message, ProviderSecretRequest):
            await env.respond(await self._grant(env.message.credential_id))

    async def _grant(self, cid: str) -> ProviderSecretGrant:
        """The secret of database credential ``cid``. Raises RouteNotFoundError when no
        database key has that id (configured keys are the ingress's own)."""
        secret = await stored(self._store.secret(cid), _WHAT)
        if secret is None:
            raise RouteNotFoundError(f"no database provider key with credential id {cid!r}")
        return ProviderSecretGrant(credential_id=cid, secret=secret, ttl_seconds=SECRET_GRANT_TTL_S)

    # -- admin verbs --------------------------------------------------------------------

    async def _list(self, cmd: AdminCommand) -> dict[str, Any]:
        db_keys, reservations = await self._read()
        roles = dict(self._configured_roles)
        configured: dict[str, list[str]] = {}
        for pool in self._pools:
            for cid in pool.credential_ids:
                configured.setdefault(cid, []).append(pool.endpoint)
        effective = dict(roles)
        for cid, role in reservations.items():
            effective[cid] = most_restrictive(effective.get(cid), role)
        for k in db_keys:
            effective[k.credential_id] = most_restrictive(
                effective.get(k.credential_id), k.min_role
            )
        known = set(configured) | {k.credential_id for k in db_keys}
        return {
            "database": [
                {**_public(k), "effective_min_role": effective.get(k.credential_id, "free")}
                for k in db_keys
            ],
            "configured": [
                {
                    "credential_id": cid,
                    "endpoints": endpoints,
                    "min_role": roles.get(cid, "free"),
                    "effective_min_role": effective.get(cid, "free"),
                }
                for cid, endpoints in configured.items()
            ],
            "reservations": [
                {"credential_id": cid, "min_role": role, "configured": cid in known}
                for cid, role in sorted(reservations.items())
            ],
        }

    async def _add(self, cmd: AdminCommand) -> dict[str, Any]:
        secret = text_arg(cmd, "key", max_chars=SECRET_ARG_MAX_CHARS)
        endpoint = text_arg(cmd, "endpoint", required=False)
        base_url = text_arg(cmd, "base_url", required=False, max_chars=SECRET_ARG_MAX_CHARS).rstrip(
            "/"
        )
        if bool(endpoint) == bool(base_url):
            raise InvalidRequestError(
                "give exactly one of 'endpoint' and 'base_url'", param="endpoint"
            )
        if endpoint and all(p.endpoint != endpoint for p in self._pools):
            raise InvalidRequestError(f"no route has endpoint id {endpoint!r}", param="endpoint")
        if base_url and all(p.base_url.rstrip("/") != base_url for p in self._pools):
            raise InvalidRequestError(f"no route has base_url {base_url!r}", param="base_url")
        role = role_arg(cmd, "min_role", "free")
        cid = credential_id(secret)
        decls, _ = await self._read()
        for held in decls:
            if (held.credential_id, held.endpoint, held.base_url) == (cid, endpoint, base_url):
                # A second row served nothing more, and deleting one left the key in the pool.
                raise InvalidRequestError(
                    f"that key is already added for this route as {held.key_id} "
                    "(set_min_role changes its tier)",
                    param="key",
                )
        decl = await stored(
            self._store.add(
                secret, endpoint=endpoint, base_url=base_url, min_role=role, now=time.time()
            ),
            _WHAT,
        )
        return {**_public(decl), **await self._apply(f"added {decl.key_id}")}

    async def _set_min_role(self, cmd: AdminCommand) -> dict[str, Any]:
        key_id, role = text_arg(cmd, "id"), role_arg(cmd, "min_role")
        decl = await stored(self._store.set_min_role(key_id, role), _WHAT)
        if decl is None:
            raise RouteNotFoundError(f"no database provider key {key_id!r}")
        return {**_public(decl), **await self._apply(f"{key_id} min_role {role}")}

    async def _delete(self, cmd: AdminCommand) -> dict[str, Any]:
        key_id = text_arg(cmd, "id")
        if not await stored(self._store.delete(key_id), _WHAT):
            raise RouteNotFoundError(f"no database provider key {key_id!r}")
        return {"id": key_id, "deleted": True, **await self._apply(f"deleted {key_id}")}

    async def _reserve(self, cmd: AdminCommand) -> dict[str, Any]:
        if "key" in cmd.args:
            cid = credential_id(text_arg(cmd, "key", max_chars=SECRET_ARG_MAX_CHARS))
        else:
            cid = text_arg(cmd, "credential_id")
        role = role_arg(cmd, "min_role")
        await stored(self._store.reserve(cid, role, time.time()), _WHAT)
        return {
            "credential_id": cid,
            "min_role": role,
            **await self._apply(f"{cid} reserved for {role}"),
        }

    async def _reload(self, cmd: AdminCommand) -> dict[str, Any]:
        return await self._apply("reloaded from the file")

    # -- helpers ------------------------------------------------------------------------

    async def _read(self) -> tuple[tuple[ProviderKeyDecl, ...], dict[str, str]]:
        return await stored(self._store.declarations(), _WHAT)

    async def _apply(self, reason: str) -> dict[str, Any]:
        """Publish the new declarations and wait until every pool applied them; returns
        ``{"pending_pools": [...]}`` (empty when all did within ``apply_timeout``; a pool
        that is down applies them when it starts)."""
        db_keys, reservations = await self._read()
        pending = {p.endpoint for p in self._pools}
        async with self.ctx.bus.subscribe(subjects.KEYPOOL_STATE_ANY) as states:
            await self._publish(db_keys, reservations)
            if pending:
                with anyio.move_on_after(self._apply_timeout):
                    async for env in states:
                        st = env.message
                        if isinstance(st, KeyPoolState) and st.declarations >= self._decls.seq:
                            pending.discard(st.pool)
                            if not pending:
                                break
        logger.info("provider keys changed (%s)", reason)
        if pending:
            logger.warning("provider key change not yet applied by %d pools", len(pending))
        return {"pending_pools": sorted(pending)}

    async def _publish(
        self, db_keys: tuple[ProviderKeyDecl, ...], reservations: dict[str, str]
    ) -> None:
        roles = dict(self._configured_roles)
        for cid, role in reservations.items():
            roles[cid] = most_restrictive(roles.get(cid), role)
        self._decls = KeyDeclarations(db_keys=db_keys, reservations=roles, seq=self._decls.seq + 1)
        await self.ctx.publish(subjects.KEYS_DECLARATIONS, self._decls)
