"""Admin HTTP API for RouteWise settings, thin clients of the admin area ``routewise``:

- ``GET /admin/routewise/model-settings?model_id=`` every key's value and source
- ``PATCH /admin/routewise/model-settings/{key}?model_id=`` body ``{"value": v}``
- ``DELETE /admin/routewise/model-settings/{key}?model_id=`` back to the inherited value
- ``GET /admin/routewise/settings`` / ``PATCH`` body ``{key: value, or null}``: the
  deployment fallback

The model id is a query parameter because ids may contain ``/``; aliases resolve to the
canonical model. The RouteWiseSettingsActor owns the settings, persists them and publishes
each change, so every ingress and ModelActor applies it on the next request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import msgspec

from gateway.admin.http import admin_request, args_of, refuse_unknown_fields
from gateway.auth.admin_access import is_admin, requested_by
from gateway.http.component import Component
from schemas import InvalidRequestError, UnauthorizedError

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

MODEL_SETTINGS = "/admin/routewise/model-settings"
SETTINGS = "/admin/routewise/settings"
KEY_PREFIX = MODEL_SETTINGS + "/"
_encode = msgspec.json.Encoder().encode
_VALUE_FIELDS = frozenset({"value"})


def _model_id(req: HttpRequest) -> str:
    query = dict(parse_qsl(bytes(req.scope.get("query_string", b"")).decode("latin-1")))
    model_id = query.get("model_id", "")
    if not model_id:
        raise InvalidRequestError("the model_id query parameter is required", param="model_id")
    return model_id


class RouteWiseAdmin(Component):
    """The HTTP routes above, for the app's route tables."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._config = config

    def reconfigure(self, config: GatewayConfig) -> None:
        """Check the admin key and wait the decision timeout of ``config`` from now on."""
        self._config = config

    def _check(self, req: HttpRequest) -> None:
        if not is_admin(req, self._config):
            raise UnauthorizedError("admin endpoints need the admin key")

    async def _ask(self, req: HttpRequest, verb: str, args: dict[str, Any]) -> None:
        result = await admin_request(
            self._bus,
            "routewise",
            verb,
            args,
            by=requested_by(req),
            timeout=self._config.routing.decision_timeout_seconds,
            request_id=req.request_id,
        )
        await req.respond(200, _encode(result))

    async def model_settings(self, req: HttpRequest) -> None:
        """``GET`` of a model's settings."""
        self._check(req)
        await self._ask(req, "model_settings", {"model_id": _model_id(req)})

    async def model_setting(self, req: HttpRequest) -> None:
        """``PATCH``/``DELETE`` of one setting of a model (its key in the path)."""
        self._check(req)
        key = "/".join(req.segments_after(KEY_PREFIX))  # each segment decoded once
        args: dict[str, Any] = {"model_id": _model_id(req), "key": key}
        if req.method == "DELETE":
            await self._ask(req, "unset_model_setting", args)
            return
        body = await args_of(req)
        refuse_unknown_fields(body, _VALUE_FIELDS, f"PATCH {KEY_PREFIX}{{key}}")
        if "value" not in body:
            raise InvalidRequestError('the body must be {"value": ...}', param="value")
        await self._ask(req, "set_model_setting", {**args, "value": body["value"]})

    async def settings(self, req: HttpRequest) -> None:
        """``GET``/``PATCH`` of the global settings."""
        self._check(req)
        if req.method == "GET":
            await self._ask(req, "settings", {})
            return
        await self._ask(req, "set_settings", {"settings": await args_of(req)})
