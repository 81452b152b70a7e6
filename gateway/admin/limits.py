"""Admin HTTP API for limits: ``GET /admin/limits``, ``GET``/``PUT``/``DELETE
/admin/limits/{kind}/{id}`` (``kind``: key, user, org, role; a user's id is ``org/user``).

A thin client of the admin area ``limits`` (``get``, ``set``, ``clear``), answered by the
LimitsActor: a change applies at once on every ingress (its ``LimitsState`` event) and is
stored. ``PUT``'s body is the limit: ``{"rpm": 60, "tpm": 100000, "concurrency": 4,
"budget": "10/month", "soft_fraction": 0.8}``. ``/admin/limits/<verb>`` (one segment) stays
the generic admin command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.admin.http import (
    admin_request,
    args_of,
    refuse_get_of_change,
    refuse_unknown_fields,
)
from gateway.auth.admin_access import requested_by
from schemas import InvalidRequestError
from schemas.limits import SPEC_ARGS

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest

PATH = "/admin/limits"
PREFIX = PATH + "/"
_encode = msgspec.json.Encoder().encode
_VERBS = {"GET": "get", "PUT": "set", "DELETE": "clear"}


async def limits_http(req: HttpRequest, bus: Bus, timeout: float) -> None:
    """Answer one limits request. Raises GatewayError (the owner's refusal, bad JSON)."""
    # Split before decoding, each segment once: ``a%2541`` is the org ``a%41``, never ``aA``,
    # and ``%2F`` a ``/`` inside an id (a user's ``org/user`` may come either way).
    parts = req.segments_after(PREFIX)
    rest = parts != [] and parts != [""]
    kind, ident = (parts[0], "/".join(parts[1:])) if rest else ("", "")
    if rest and not ident:  # /admin/limits/<verb>: the generic admin command
        refuse_get_of_change(req, "limits", kind)
        verb, args = kind, await args_of(req)
    else:
        verb = _VERBS.get(req.method, "")
        if not verb:
            raise InvalidRequestError(
                f"{req.method} is not a method of /admin/limits/{{kind}}/{{id}}: "
                "PUT sets the limit, GET reads it, DELETE clears it"
            )
        args = await args_of(req) if req.method == "PUT" else {}
        if rest:
            # The path names the subject: a body's kind, id or subject was overwritten by it.
            refuse_unknown_fields(args, SPEC_ARGS, f"PUT {PREFIX}{{kind}}/{{id}}")
            args.update(kind=kind, id=ident)
        elif req.method != "GET":
            raise InvalidRequestError("name the subject: /admin/limits/{kind}/{id}")
    result: dict[str, Any] = await admin_request(
        bus, "limits", verb, args, by=requested_by(req), timeout=timeout, request_id=req.request_id
    )
    await req.respond(200, _encode(result))
