"""Admin commands, client side: the bus helper and the HTTP API ``/admin/<area>/<verb>``.

Both the HTTP admin API and ``llmgw admin`` are thin clients of the command the area's owner
answers on ``llmgw.admin.<area>.<verb>`` (see ``actors.admin``). ``POST`` takes the verb's
arguments as a JSON object; ``GET`` takes them from the query string (as strings). Admin
callers only (:func:`gateway.auth.admin_access.is_admin`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

import msgspec

from schemas import (
    AdminCommand,
    AdminReply,
    InvalidRequestError,
    NoRespondersError,
    RouteNotFoundError,
    raise_for_reply,
    subjects,
)

if TYPE_CHECKING:
    from bus import Bus
    from gateway.ingress.request import HttpRequest

PREFIX = "/admin/"
ADMIN_TIMEOUT_S = 30.0  # an owner may wait for others (a reload, pools applying keys)
_MAX_ARGS_BYTES = 1024 * 1024


async def admin_request(
    bus: Bus,
    area: str,
    verb: str,
    args: dict[str, Any] | None = None,
    *,
    by: str,
    timeout: float,
) -> dict[str, Any]:
    """Send one admin command and return its result.

    Raises the GatewayError the owner answered, NoRespondersError when no actor owns
    ``area`` (or the actors are down), BusTimeoutError when it does not answer in time.
    """
    try:
        reply = await bus.request(
            subjects.admin(area, verb),
            AdminCommand(args=args or {}, by=by),
            reply_type=AdminReply,
            timeout=timeout,
        )
    except NoRespondersError:
        raise NoRespondersError(
            f"nobody answers admin area {area!r} (no such area, or the actors are down)"
        ) from None
    return raise_for_reply(reply).result


def command_of(req: HttpRequest) -> tuple[str, str]:
    """(area, verb) of ``/admin/<area>/<verb>``. Raises RouteNotFoundError."""
    parts = req.path[len(PREFIX) :].split("/")
    if len(parts) != 2 or not all(parts):
        raise RouteNotFoundError(
            f"no such path {req.path}; admin commands are /admin/<area>/<verb>"
        )
    return unquote(parts[0]), unquote(parts[1])


async def args_of(req: HttpRequest) -> dict[str, Any]:
    """The command's arguments. Raises InvalidRequestError."""
    if req.method == "GET":
        query = bytes(req.scope.get("query_string", b"")).decode("latin-1")
        return dict(parse_qsl(query))
    raw = await req.body(_MAX_ARGS_BYTES)
    if not raw.strip():
        return {}
    try:
        args = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequestError(
            "the request body is not valid JSON or is nested too deeply"
        ) from None
    if not isinstance(args, dict):
        raise InvalidRequestError("the request body must be a JSON object of arguments")
    return args
