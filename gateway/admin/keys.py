"""Admin HTTP API for callers and credentials (every path needs an admin key; the auth gate
enforces it before these handlers run).

Gateway API keys (admin area ``api_keys``, answered by the ApiKeyAdminActor; the same table
``llmgw keys`` writes):
  ``GET /admin/keys`` · ``POST /admin/keys`` {org, user, role, name?, expires_in?, expires_at?}
  (the key is in this answer only) · ``POST /admin/keys/{id}/revoke`` · ``DELETE /admin/keys/{id}``
Provider keys (spec "Reserving upstream keys for a tier"):
  ``GET /admin/provider-keys`` (database keys, configured keys with their effective tier, and
  reservations, flagging those that point at no configured key) ·
  ``POST /admin/provider-keys`` {key, endpoint | base_url, min_role?} ·
  ``POST /admin/provider-keys/{id}/min-role`` {min_role} · ``DELETE /admin/provider-keys/{id}`` ·
  ``POST /admin/provider-keys/min-role-env`` {key | credential_id, min_role} (``free`` lifts it)

The provider-key paths are thin clients of the admin area ``provider_keys``
(``llmgw.admin.provider_keys.<verb>``: list, add, set_min_role, delete, reserve), which the
KeyRegistryActor answers once every pool applied the change (``actors.keyregistry``). No
answer, log line or event carries a provider secret: keys appear as their ``k-…`` ids.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.admin.http import ADMIN_TIMEOUT_S, admin_request, args_of, refuse_unknown_fields
from gateway.auth.admin_access import requested_by
from gateway.auth.gate import Authenticator, caller_of
from gateway.http.request import HttpRequest
from schemas import InvalidRequestError, RouteNotFoundError
from schemas.config import credential_id
from schemas.keys import hash_key
from schemas.names import SECRET_MAX_CHARS, checked_text

if TYPE_CHECKING:
    from bus import Bus

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], Awaitable[None]]
_encode = msgspec.json.Encoder().encode
_MIN_ROLE_FIELDS = frozenset({"min_role"})
_RESERVE_FIELDS = frozenset({"key", "credential_id", "min_role"})


def _segments(req: HttpRequest, prefix: str) -> list[str]:
    return [s for s in req.segments_after(prefix) if s]


class AdminKeys:
    """The handlers: thin clients of the admin areas ``api_keys`` and ``provider_keys``. Owns
    nothing; after a gateway-key change it updates this ingress's auth cache so the
    change holds here as soon as the answer is sent."""

    def __init__(self, bus: Bus, auth: Authenticator) -> None:
        self._bus = bus
        self._auth = auth

    # -- gateway API keys ---------------------------------------------------------------

    async def list_keys(self, req: HttpRequest) -> None:
        await req.respond(200, _encode(await self._command(req, "api_keys", "list", {})))

    async def create_key(self, req: HttpRequest) -> None:
        made = await self._command(req, "api_keys", "create", await args_of(req))
        self._auth.key_created(hash_key(str(made["key"])))
        await req.respond(201, _encode(made))

    async def revoke_key(self, req: HttpRequest) -> None:
        parts = _segments(req, "/admin/keys/")
        revoke = req.method == "POST" and len(parts) == 2 and parts[1] == "revoke"
        if not (revoke or (req.method == "DELETE" and len(parts) == 1)):
            raise RouteNotFoundError(f"no such path {req.split_path()}")
        revoked = await self._command(req, "api_keys", "revoke", {"id": parts[0]})
        self._auth.forget_key_id(str(revoked["id"]))
        await req.respond(200, _encode(revoked))

    # -- provider keys ------------------------------------------------------------------

    async def list_provider_keys(self, req: HttpRequest) -> None:
        await req.respond(200, _encode(await self._command(req, "provider_keys", "list", {})))

    async def add_provider_key(self, req: HttpRequest) -> None:
        result = await self._command(req, "provider_keys", "add", await args_of(req))
        await req.respond(201, _encode(result))

    async def set_min_role(self, req: HttpRequest) -> None:
        parts = _segments(req, "/admin/provider-keys/")
        if len(parts) != 2 or parts[1] != "min-role":
            raise RouteNotFoundError(f"no such path {req.split_path()}")
        body = await args_of(req)
        # The path names the key: a body's "id" was overwritten by it.
        refuse_unknown_fields(body, _MIN_ROLE_FIELDS, "POST /admin/provider-keys/{id}/min-role")
        args = {**body, "id": parts[0]}
        changed = await self._command(req, "provider_keys", "set_min_role", args)
        await req.respond(200, _encode(changed))

    async def delete_provider_key(self, req: HttpRequest) -> None:
        parts = _segments(req, "/admin/provider-keys/")
        if len(parts) != 1:
            raise RouteNotFoundError(f"no such path {req.split_path()}")
        await req.respond(
            200, _encode(await self._command(req, "provider_keys", "delete", {"id": parts[0]}))
        )

    async def reserve_env_key(self, req: HttpRequest) -> None:
        args = await args_of(req)
        refuse_unknown_fields(args, _RESERVE_FIELDS, "POST /admin/provider-keys/min-role-env")
        if "key" in args and "credential_id" in args:  # the key's id replaced the one given
            raise InvalidRequestError("give one of 'key' and 'credential_id'", param="key")
        if "key" in args:
            # A reservation needs only the hash: the secret stays on this ingress, checked
            # here as the owner checks a key added (it never sees this one).
            args["credential_id"] = credential_id(
                checked_text(args.pop("key"), "key", SECRET_MAX_CHARS)
            )
        await req.respond(200, _encode(await self._command(req, "provider_keys", "reserve", args)))

    # -- helpers ------------------------------------------------------------------------

    async def _command(
        self, req: HttpRequest, area: str, verb: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """One admin command on the bus, sent on behalf of ``req``'s admin caller."""
        by = requested_by(req, f"http:{caller_of(req).key_id or 'admin'}")
        return await admin_request(
            self._bus, area, verb, args, by=by, timeout=ADMIN_TIMEOUT_S, request_id=req.request_id
        )
