"""Admin HTTP API for callers and credentials (every path needs an admin key; the auth gate
enforces it before these handlers run).

Gateway API keys (same store as ``llmgw keys``):
  ``GET /admin/keys`` · ``POST /admin/keys`` {org, user, role, name?, expires_in?, expires_at?}
  (the key is in this answer only) · ``POST /admin/keys/{id}/revoke`` · ``DELETE /admin/keys/{id}``
Provider keys (spec "Reserving upstream keys for a tier"):
  ``GET /admin/provider-keys`` (database keys, configured keys with their effective tier, and
  reservations, flagging those that point at no configured key) ·
  ``POST /admin/provider-keys`` {key, endpoint | base_url, min_role?} ·
  ``POST /admin/provider-keys/{id}/min-role`` {min_role} · ``DELETE /admin/provider-keys/{id}`` ·
  ``POST /admin/provider-keys/min-role-env`` {key | credential_id, min_role} (``free`` lifts it)

A provider-key change is written to the database here (only this process holds the secret),
then the key registry reloads and every pool applies it before the answer is sent. No answer,
log line or event carries a secret: keys appear as their ``k-…`` ids.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from actors.keypool_actor import config_roles
from actors.keystore import ProviderKeyStore
from bus import Bus
from gateway.api_keys import ApiKeyStore, parse_duration, parse_instant
from gateway.auth import Authenticator, caller_of
from gateway.http import HttpRequest
from gateway.provider_secrets import ProviderSecrets
from schemas import (
    AdminExecuted,
    ApiKeyCreated,
    ApiKeyRevoked,
    InvalidRequestError,
    KeyDeclarations,
    KeyPoolState,
    ProviderKeysChanged,
    RouteNotFoundError,
    raise_for_reply,
    subjects,
)
from schemas.config import GatewayConfig, credential_id
from schemas.keys import ROLES, most_restrictive

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], Awaitable[None]]
_encode = msgspec.json.Encoder().encode
_BODY_LIMIT = 64 * 1024


async def _json_object(req: HttpRequest) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(await req.body(_BODY_LIMIT))
    except msgspec.DecodeError:
        raise InvalidRequestError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str, *, required: bool = True) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"'{name}' must be a non-empty string", param=name)
    return value.strip()


def _role(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if value not in ROLES:
        raise InvalidRequestError(f"'{name}' must be one of {', '.join(ROLES)}", param=name)
    return str(value)


def _segments(path: str, prefix: str) -> list[str]:
    return [s for s in path[len(prefix):].split("/") if s]


class AdminKeys:
    """The handlers; owns nothing but references to the stores and the ingress's caches."""

    def __init__(self, bus: Bus, config: GatewayConfig, auth: Authenticator,
                 api_keys: ApiKeyStore, provider_keys: ProviderKeyStore,
                 secrets: ProviderSecrets) -> None:
        self._bus = bus
        self._config = config
        self._auth = auth
        self._api_keys = api_keys
        self._provider = provider_keys
        self._secrets = secrets
        self._timeout = config.routing.decision_timeout_seconds
        self._routes: dict[str, tuple[str, str]] = {}  # endpoint -> (base_url, model)
        for m in config.models:
            for eid, r in zip(m.endpoint_ids(), m.route, strict=True):
                self._routes[eid] = (r.base_url.rstrip("/"), m.id)

    def routes(self) -> dict[tuple[str, str], Handler]:
        """Exact (method, path) routes."""
        return {
            ("GET", "/admin/keys"): self.list_keys,
            ("POST", "/admin/keys"): self.create_key,
            ("GET", "/admin/provider-keys"): self.list_provider_keys,
            ("POST", "/admin/provider-keys"): self.add_provider_key,
            ("POST", "/admin/provider-keys/min-role-env"): self.reserve_env_key,
        }

    def prefix_routes(self) -> dict[tuple[str, str], Handler]:
        """(method, path prefix) routes, for paths carrying an id."""
        return {
            ("POST", "/admin/keys/"): self.revoke_key,
            ("DELETE", "/admin/keys/"): self.revoke_key,
            ("POST", "/admin/provider-keys/"): self.set_min_role,
            ("DELETE", "/admin/provider-keys/"): self.delete_provider_key,
        }

    # -- gateway API keys ---------------------------------------------------------------

    async def list_keys(self, req: HttpRequest) -> None:
        now = time.time()
        rows = [r.public(now) for r in await self._api_keys.records()]
        await req.respond(200, _encode({"data": rows}))

    async def create_key(self, req: HttpRequest) -> None:
        body = await _json_object(req)
        now = time.time()
        try:
            expires = (now + parse_duration(body["expires_in"]) if "expires_in" in body
                       else parse_instant(body["expires_at"]) if "expires_at" in body else None)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"bad expiry: {exc}", param="expires_in") from None
        key, record = await self._api_keys.create(
            org=_text(body, "org"), user=_text(body, "user"), role=_role(body, "role"),
            name=_text(body, "name", required=False), expires=expires, now=now)
        self._auth.key_created(record.key_hash)
        await self._bus.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyCreated(key_hash=record.key_hash))
        await self._audit(req, "keys", "create", f"{record.id} ({record.role})")
        await req.respond(201, _encode({**record.public(now), "key": key}))

    async def revoke_key(self, req: HttpRequest) -> None:
        parts = _segments(req.path, "/admin/keys/")
        revoke = req.method == "POST" and len(parts) == 2 and parts[1] == "revoke"
        if not (revoke or (req.method == "DELETE" and len(parts) == 1)):
            raise RouteNotFoundError(f"no such path {req.path}")
        record = await self._api_keys.revoke(parts[0], time.time())
        if record is None:
            raise RouteNotFoundError(f"no gateway API key {parts[0]!r}")
        self._auth.forget(record.key_hash)
        await self._bus.publish(subjects.AUTH_KEYS_CHANGED, ApiKeyRevoked(key_hash=record.key_hash))
        await self._audit(req, "keys", "revoke", record.id)
        await req.respond(200, _encode(record.public(time.time())))

    # -- provider keys ------------------------------------------------------------------

    async def list_provider_keys(self, req: HttpRequest) -> None:
        db_keys, reservations = await self._provider.declarations()
        roles = config_roles(self._config)
        configured: dict[str, dict[str, Any]] = {}
        for m in self._config.models:
            for eid, r in zip(m.endpoint_ids(), m.route, strict=True):
                for secret, _ in r.key_declarations:
                    entry = configured.setdefault(credential_id(secret), {"endpoints": []})
                    entry["endpoints"].append(eid)
        effective = dict(roles)
        for cid, role in reservations.items():
            effective[cid] = most_restrictive(effective.get(cid), role)
        for k in db_keys:
            effective[k.credential_id] = most_restrictive(effective.get(k.credential_id),
                                                          k.min_role)
        known = set(configured) | {k.credential_id for k in db_keys}
        await req.respond(200, _encode({
            "database": [{"id": k.key_id, "credential_id": k.credential_id,
                          "endpoint": k.endpoint, "base_url": k.base_url,
                          "min_role": k.min_role, "created": k.created,
                          "effective_min_role": effective.get(k.credential_id, "free")}
                         for k in db_keys],
            "configured": [{"credential_id": cid, "endpoints": e["endpoints"],
                            "min_role": roles.get(cid, "free"),
                            "effective_min_role": effective.get(cid, "free")}
                           for cid, e in configured.items()],
            "reservations": [{"credential_id": cid, "min_role": role,
                              "configured": cid in known}
                             for cid, role in sorted(reservations.items())],
        }))

    async def add_provider_key(self, req: HttpRequest) -> None:
        body = await _json_object(req)
        secret = _text(body, "key")
        endpoint = _text(body, "endpoint", required=False)
        base_url = _text(body, "base_url", required=False).rstrip("/")
        if bool(endpoint) == bool(base_url):
            raise InvalidRequestError("give exactly one of 'endpoint' and 'base_url'",
                                      param="endpoint")
        if endpoint and endpoint not in self._routes:
            raise InvalidRequestError(f"no route has endpoint id {endpoint!r}", param="endpoint")
        if base_url and all(b != base_url for b, _ in self._routes.values()):
            raise InvalidRequestError(f"no route has base_url {base_url!r}", param="base_url")
        decl = await self._provider.add(secret, endpoint=endpoint, base_url=base_url,
                                        min_role=_role(body, "min_role", "free"),
                                        now=time.time())
        await self._apply(f"added {decl.key_id}")
        await self._audit(req, "provider_keys", "add", f"{decl.key_id} {decl.credential_id}")
        await req.respond(201, _encode({"id": decl.key_id, "credential_id": decl.credential_id,
                                        "endpoint": decl.endpoint, "base_url": decl.base_url,
                                        "min_role": decl.min_role, "created": decl.created}))

    async def set_min_role(self, req: HttpRequest) -> None:
        parts = _segments(req.path, "/admin/provider-keys/")
        if len(parts) != 2 or parts[1] != "min-role":
            raise RouteNotFoundError(f"no such path {req.path}")
        role = _role(await _json_object(req), "min_role")
        decl = await self._provider.set_min_role(parts[0], role)
        if decl is None:
            raise RouteNotFoundError(f"no database provider key {parts[0]!r}")
        await self._apply(f"{decl.key_id} min_role {role}")
        await self._audit(req, "provider_keys", "min-role", f"{decl.key_id} -> {role}")
        await req.respond(200, _encode({"id": decl.key_id, "credential_id": decl.credential_id,
                                        "min_role": decl.min_role}))

    async def delete_provider_key(self, req: HttpRequest) -> None:
        parts = _segments(req.path, "/admin/provider-keys/")
        if len(parts) != 1:
            raise RouteNotFoundError(f"no such path {req.path}")
        if not await self._provider.delete(parts[0]):
            raise RouteNotFoundError(f"no database provider key {parts[0]!r}")
        await self._apply(f"deleted {parts[0]}")
        await self._audit(req, "provider_keys", "delete", parts[0])
        await req.respond(200, _encode({"id": parts[0], "deleted": True}))

    async def reserve_env_key(self, req: HttpRequest) -> None:
        body = await _json_object(req)
        if "key" in body:
            cid = credential_id(_text(body, "key"))
        else:
            cid = _text(body, "credential_id")
        role = _role(body, "min_role")
        await self._provider.reserve(cid, role, time.time())
        await self._apply(f"{cid} reserved for {role}")
        await self._audit(req, "provider_keys", "min-role-env", f"{cid} -> {role}")
        await req.respond(200, _encode({"credential_id": cid, "min_role": role}))

    # -- helpers ------------------------------------------------------------------------

    async def _apply(self, reason: str) -> None:
        """Have the registry reload and wait until every pool applied it (bounded by the
        decision timeout; a pool that is down applies it when it starts)."""
        pending = set(self._routes)
        async with self._bus.subscribe(subjects.KEYPOOL_STATE_ANY) as sub:
            reply = raise_for_reply(await self._bus.request(
                subjects.KEYS_CHANGED, ProviderKeysChanged(reason=reason),
                reply_type=KeyDeclarations, timeout=self._timeout))
            with anyio.move_on_after(self._timeout):
                async for env in sub:
                    st = env.message
                    if isinstance(st, KeyPoolState) and st.declarations >= reply.seq:
                        pending.discard(st.pool)
                    if not pending:
                        break
        if pending:
            logger.warning("provider key change not yet applied by %d pools", len(pending))
        await self._secrets.reload()

    async def _audit(self, req: HttpRequest, area: str, verb: str, message: str) -> None:
        by = f"http:{caller_of(req).key_id or 'admin'}"
        logger.info("admin %s %s by %s: %s", area, verb, by, message)
        await self._bus.publish(subjects.event("admin"), AdminExecuted(
            area=area, verb=verb, by=by, message=message, ts=time.time()))
