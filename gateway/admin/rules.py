"""Admin HTTP API for the routing rule set: ``GET`` and ``PUT /api/fallback/routing-rules``.

Thin clients of the admin commands ``rules.get`` and ``rules.put`` (answered by the
RulesActor, which persists the set and publishes it to every ingress). ``PUT`` takes the
whole set ``{"rules": [{name, when, route}, ...]}`` and replaces it atomically; an invalid
set is a 400 naming the path of its first problem and changes nothing. Admin callers only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.admin.http import ADMIN_TIMEOUT_S, admin_request, refuse_too_large, too_deep
from gateway.auth.admin_access import requested_by, require_admin
from gateway.http.component import Component
from schemas import InvalidRequestError
from schemas.rules import MAX_DEPTH

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

PATH = "/api/fallback/routing-rules"
_MAX_BODY = 512 * 1024  # room for any set within the budget (at most 1,500 comparisons)
# JSON levels of the deepest valid set: {"rules": [{"when": ...}]} around MAX_DEPTH levels of
# {"$and": [...]} and a comparison's own object and list, with room to spare.
_MAX_JSON_DEPTH = 64
_encode = msgspec.json.Encoder().encode


class RulesAdmin(Component):
    """The two routes; holds the bus and the config (for the admin check) only."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._config = config

    def reconfigure(self, config: GatewayConfig) -> None:
        """Check the admin key of ``config`` from the next request on."""
        self._config = config

    def _admin_only(self, req: HttpRequest) -> None:
        require_admin(req, self._config, "admin endpoints need the admin key")

    async def get(self, req: HttpRequest) -> None:
        """``GET``: the rule set."""
        self._admin_only(req)
        result = await admin_request(
            self._bus,
            "rules",
            "get",
            by=requested_by(req),
            timeout=ADMIN_TIMEOUT_S,
            request_id=req.request_id,
        )
        await req.respond(200, _encode(result))

    async def put(self, req: HttpRequest) -> None:
        """``PUT``: replace the rule set. Raises InvalidRequestError for a malformed set."""
        self._admin_only(req)
        try:
            body: Any = msgspec.json.decode(await req.body(_MAX_BODY))
        except msgspec.DecodeError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        except RecursionError:
            body = None
        if body is None or too_deep(body, _MAX_JSON_DEPTH):
            # Refused here: a set this deep would only exhaust the stack of whoever reads it.
            raise InvalidRequestError(
                f"the rule set is JSON nested more than {_MAX_JSON_DEPTH} levels deep "
                f"(a rule allows {MAX_DEPTH} levels of $and/$or)",
                param="rules",
            )
        if not isinstance(body, dict):
            raise InvalidRequestError('the body is a rule set {"rules": [...]}', param="rules")
        result = await admin_request(
            self._bus,
            "rules",
            "put",
            refuse_too_large(body),  # as /admin/rules/put refuses it: no bus codec takes it
            by=requested_by(req),
            timeout=ADMIN_TIMEOUT_S,
            request_id=req.request_id,
        )
        await req.respond(200, _encode(result))
