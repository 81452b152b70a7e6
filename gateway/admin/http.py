"""Admin commands, client side: the bus helper and the HTTP API ``/admin/<area>/<verb>``.

Both the HTTP admin API and ``llmgw admin`` are thin clients of the command the area's owner
answers on ``llmgw.admin.<area>.<verb>`` (see ``actors.admin``). ``POST`` takes the verb's
arguments as a JSON object; ``GET`` takes them from the query string (as strings), for a
verb that changes nothing only (``schemas.READ_ONLY_ADMIN_VERBS``). Admin callers only
(:func:`gateway.auth.admin_access.is_admin`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl

import anyio
import msgspec

from gateway.http.request import request_ids
from schemas import (
    AdminCommand,
    AdminReply,
    BusDisconnectedError,
    GatewayError,
    InvalidRequestError,
    ModeChanged,
    ModeRequest,
    NoRespondersError,
    OutcomeUnknownError,
    RouteNotFoundError,
    raise_for_reply,
    subjects,
)
from schemas.admin_areas import is_admin_change
from schemas.keys import fits_int64

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from bus import Bus
    from gateway.http.request import HttpRequest

T = TypeVar("T")

PREFIX = "/admin/"
ADMIN_TIMEOUT_S = 30.0  # an owner may wait for others (a reload, pools applying keys)
_MAX_ARGS_BYTES = 1024 * 1024
_PROBE_TIMEOUT_S = 1.0  # are the actors up at all, once an area found no responders
_COMMAND_IDS = request_ids()  # for the commands no HTTP exchange sends (the CLI, SIGHUP)
RESEND_PAUSE_S = 0.25
"""Between two copies of a command that found no owner after a reconnect (its owner's
process reconnecting too)."""
RECONNECT_GRACE_S = 2.0
"""How long an admin command waits for a lost bus connection to come back before it gives
up (503): one sent meanwhile would wait out its whole timeout unheard, and one already
waiting for its reply would wait it out for a reply the lost connection dropped."""


async def admin_request(
    bus: Bus,
    area: str,
    verb: str,
    args: dict[str, Any] | None = None,
    *,
    by: str,
    timeout: float,
    request_id: str = "",
) -> dict[str, Any]:
    """Send one admin command and return its result. ``request_id`` names the exchange that
    asked (an HTTP answer's ``x-request-id``): the audit event carries it; a command sent
    without one is given its own, shaped as the ingress's.

    A connection lost while the command waits for its answer and back within
    :data:`RECONNECT_GRACE_S` may have lost that answer: the command is sent again, under the
    same id, and its owner (``actors.admin_once``) answers it with the first one's answer
    rather than run it twice; a copy that finds no owner (its process not back yet) is sent
    again every :data:`RESEND_PAUSE_S` until the deadline, then OutcomeUnknownError.

    Raises the GatewayError the owner answered, RouteNotFoundError when the actors run but
    none owns ``area``, NoRespondersError when the actors are down, BusTimeoutError when the
    owner does not answer in time; when the bus connection is lost and not back within
    :data:`RECONNECT_GRACE_S`: BusDisconnectedError before the command is sent,
    OutcomeUnknownError while it waits for its reply (it may have been applied).
    """
    until = anyio.current_time() + timeout  # one deadline, whatever the connection does
    if not bus.connected:
        await _reconnected(bus, until)
    command = AdminCommand(args=args or {}, by=by, request_id=request_id or next(_COMMAND_IDS))
    subject = subjects.admin(area, verb)
    sent_before = False  # a copy is being sent: the command may already have been applied
    while True:
        try:
            reply = await _unless_lost(
                bus,
                until,
                bus.request(
                    subject,
                    command,
                    reply_type=AdminReply,
                    timeout=max(until - anyio.current_time(), 0.001),
                ),
            )
        except NoRespondersError:
            if not sent_before:
                raise await _nobody_answers(bus, area) from None
            # The owner's process reconnects too, maybe after this one: ask until it is back.
            if anyio.current_time() + RESEND_PAUSE_S >= until:
                raise OutcomeUnknownError(_SENT_NOT_ANSWERED) from None
            await anyio.sleep(RESEND_PAUSE_S)
            continue
        if not isinstance(reply, _SendAgain):
            return raise_for_reply(reply).result
        sent_before = True


_SENT_NOT_ANSWERED = (
    "the gateway lost its connection to its message bus (NATS) while the command waited for "
    "its answer, and the command's owner has not answered it since: it may have been "
    "applied, so its outcome is unknown; check before sending it again"
)


async def _nobody_answers(bus: Bus, area: str) -> GatewayError:
    """The error for a command no owner took: RouteNotFoundError when the actors run (none
    owns ``area``), else NoRespondersError."""
    if await _actors_answer(bus):
        return RouteNotFoundError(f"no admin area {area!r}")
    return NoRespondersError(f"nobody answers admin area {area!r}: the actors are not running")


class _SendAgain:
    """What :func:`_unless_lost` returns for a request to send again."""


_SEND_AGAIN = _SendAgain()


async def _unless_lost(bus: Bus, until: float, request: Awaitable[T]) -> T | _SendAgain:
    """What ``request`` (a bus request) returns, unless the bus connection is lost while it
    waits: nats-py fails no request then, and a reply sent into the lost connection never
    comes, so it is abandoned. :data:`_SEND_AGAIN` when the connection is back within
    :data:`RECONNECT_GRACE_S` (and before ``until``, the command's deadline); else raises
    OutcomeUnknownError. Raises what ``request`` raises.

    Here and not in ``Bus.request``: an admin command waits up to 30 s and its caller can
    check what it did; the ingress's requests wait a few seconds at most, make no task per
    request, and their callers decide for themselves what an unanswered request means."""
    answer: list[T] = []
    failed: list[Exception] = []
    back: list[bool] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_cancel_when_lost, bus, until, tg.cancel_scope, back)
        try:
            answer.append(await request)
        except Exception as exc:  # raised below as it is, not in the task group's group
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if answer:
        return answer[0]
    if back == [True]:
        return _SEND_AGAIN
    raise OutcomeUnknownError(
        "the gateway lost its connection to its message bus (NATS) while the command "
        "waited for its answer, and it is not back: the command may have reached its "
        "owner and been applied, so its outcome is unknown; check before sending it again"
    )


async def _cancel_when_lost(
    bus: Bus, until: float, scope: anyio.CancelScope, back: list[bool]
) -> None:
    """Cancel ``scope`` once ``bus`` loses its connection, noting in ``back`` whether it
    came back within the grace (and before ``until``)."""
    await bus.disconnected()
    back.append(await _back_within_grace(bus, until))
    scope.cancel()


async def _back_within_grace(bus: Bus, until: float) -> bool:
    """Whether ``bus`` is connected, waiting up to :data:`RECONNECT_GRACE_S` for it, and not
    past ``until`` (False at once when it is closed)."""
    with anyio.move_on_after(min(RECONNECT_GRACE_S, until - anyio.current_time())):
        while not bus.connected and not bus.closed:
            with anyio.move_on_after(0.1):  # connected may flip without a reconnect event
                await bus.reconnected()
    return bus.connected


async def _reconnected(bus: Bus, until: float) -> None:
    """Return once ``bus`` is connected again. Raises BusDisconnectedError when it is not
    within :data:`RECONNECT_GRACE_S` (or it is closed)."""
    if not await _back_within_grace(bus, until):
        raise BusDisconnectedError(
            "the gateway has lost its connection to its message bus (NATS) and is "
            "reconnecting; admin commands cannot reach their owners until it is back"
        )


async def _actors_answer(bus: Bus) -> bool:
    """Whether the actors run: the mode's owner (started last in the tree) answers."""
    try:
        reply = await bus.request(
            subjects.MODE_GET, ModeRequest(), reply_type=ModeChanged, timeout=_PROBE_TIMEOUT_S
        )
    except GatewayError:
        return False
    return isinstance(reply, ModeChanged)


def command_of(req: HttpRequest) -> tuple[str, str]:
    """(area, verb) of ``/admin/<area>/<verb>``. Raises RouteNotFoundError, or
    InvalidRequestError for a path that does not decode."""
    parts = req.segments_after(PREFIX)
    if len(parts) != 2 or not all(parts):
        raise RouteNotFoundError(
            f"no such path {req.split_path()}; admin commands are /admin/<area>/<verb>"
        )
    return parts[0], parts[1]


def too_deep(value: Any, max_depth: int) -> bool:
    """Whether ``value`` (decoded JSON) nests arrays and objects more than ``max_depth``
    levels deep; walked without recursion, so any depth msgspec decoded is measured."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def too_large(args: dict[str, Any]) -> str | None:
    """The path (``weight``, ``models[2].position``) of the first integer in ``args`` an int64
    cannot hold, or None. No admin argument needs one, and a store would overflow on it."""
    stack: list[tuple[Any, str]] = [(args, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, int) and not fits_int64(item):
            return path
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return None


def refuse_too_large(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` unless an integer in them is out of int64 range. Raises InvalidRequestError
    naming it."""
    path = too_large(args)
    if path is not None:
        raise InvalidRequestError(f"'{path}' is out of range", param=path)
    return args


_FIELD_NAME_MAX = 256


def refuse_unknown_fields(body: dict[str, Any], taken: frozenset[str], route: str) -> None:
    """Raise InvalidRequestError naming the first field of ``body`` not in ``taken``, as the
    bus admin areas refuse an argument their verb does not take: a dedicated route dropped
    it, so a misspelt field (``header`` for ``headers``) read as applied when it was not."""
    if unknown := sorted(set(body) - taken):
        name = str(unknown[0])[:_FIELD_NAME_MAX]
        takes = f"it takes {', '.join(sorted(taken))}" if taken else "it takes none"
        raise InvalidRequestError(f"{route} takes no field {name!r} ({takes})", param=name)


def refuse_get_of_change(req: HttpRequest, area: str, verb: str) -> None:
    """Raise InvalidRequestError when ``req`` is a GET of a verb that changes state: a GET is
    safe to repeat (a proxy or a client retrying it, a link followed), a change is not."""
    if req.method == "GET" and is_admin_change(area, verb):
        raise InvalidRequestError(
            f"GET only reads, and {area} {verb} is no read-only command: send it with POST"
        )


async def args_of(req: HttpRequest) -> dict[str, Any]:
    """The command's arguments. Raises InvalidRequestError (not JSON, not an object, an
    integer out of int64 range)."""
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
    return refuse_too_large(args)
