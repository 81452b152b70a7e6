"""``GET /events``: the operator event stream (``llmgw.events.>``) as Server-Sent Events.

One frame per event: ``event: <kind>`` and ``data:`` the event as JSON with its ``kind`` and
``type``, the same lines ``llmgw events`` prints. ``?kind=circuit,config`` filters. A comment
line is sent once subscribed and every 15 s, so proxies keep the connection open. The stream
ends when the client goes away or the bus closes, or, for a caller that put a check under
:data:`STILL_ALLOWED_SCOPE_KEY` in the request's scope (the dashboard: is the session still
on?), at the first frame due once that check says no: a session signed out or a key revoked
gets no event after it.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import anyio
import msgspec

from bus import BusClosedError
from gateway.auth.admin_access import STILL_ALLOWED_SCOPE_KEY
from schemas import InvalidRequestError, subjects
from schemas.keys import parse_since

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable
    from contextlib import AbstractAsyncContextManager

    from bus import Bus, Subscription
    from gateway.http.request import HttpRequest
    from schemas import Message

_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
HEARTBEAT_S = 15.0
_encode = msgspec.json.Encoder().encode


def event_kind(subject: str) -> str:
    """The ``<kind>`` of ``llmgw.events.<kind>``."""
    return subjects.untoken(subject.rsplit(".", 1)[-1])


def event_json(subject: str, msg: Message) -> bytes:
    """One event as JSON: ``{"kind": ..., "type": ..., <fields>}``."""
    body: dict[str, Any] = {"kind": event_kind(subject)}
    body.update(msgspec.to_builtins(msg))
    return _encode(body)


def unknown_kinds(kinds: Iterable[str]) -> str | None:
    """A message naming the kinds that are no event kind and the real ones; None if none."""
    unknown = sorted(set(kinds) - set(subjects.EVENT_KINDS))
    if not unknown:
        return None
    return (
        f"no event kind {', '.join(map(repr, unknown))}; "
        f"the kinds are {', '.join(subjects.EVENT_KINDS)}"
    )


def _query(req: HttpRequest) -> dict[str, list[str]]:
    return parse_qs(bytes(req.scope.get("query_string", b"")).decode("latin-1"))


def kinds_of(req: HttpRequest) -> frozenset[str]:
    """The ``kind`` filter of the query string (empty: every kind). Raises
    InvalidRequestError for a kind no event has."""
    kinds = frozenset(k for v in _query(req).get("kind", ()) for k in v.split(",") if k)
    problem = unknown_kinds(kinds)
    if problem:
        raise InvalidRequestError(problem, param="kind")
    return kinds


def since_of(req: HttpRequest) -> float | None:
    """The ``since`` of the query string as unix seconds (given as unix seconds, an ISO 8601
    time or a duration ago such as ``10m``, as every ``since`` is): replay the kept events
    from then on first. Raises InvalidRequestError."""
    values = _query(req).get("since")
    if not values:
        return None
    try:
        since = parse_since(values[-1], time.time())
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        raise InvalidRequestError(
            "'since' is a time (unix seconds or ISO 8601) or a duration ago (10m, 2h, 1d)",
            param="since",
        )
    return since


async def stream_events(
    req: HttpRequest, bus: Bus, kinds: frozenset[str], since: float | None = None
) -> None:
    """Relay events to ``req`` until the client leaves or the bus closes; with ``since``,
    first those the bus kept from then on. Raises InvalidRequestError when ``since`` is asked
    of a bus that keeps none (``events.stream: false``, or NATS without JetStream)."""
    pattern = subjects.event(next(iter(kinds))) if len(kinds) == 1 else subjects.EVENTS_ANY
    subscribing: AbstractAsyncContextManager[Subscription] = (
        bus.subscribe(pattern)
        if since is None
        else bus.replay(pattern, stream=subjects.EVENTS_STREAM, since=since)
    )
    async with contextlib.AsyncExitStack() as stack:
        try:
            sub = await stack.enter_async_context(subscribing)
        except BusClosedError as exc:
            if since is None:
                raise
            raise InvalidRequestError(
                f"this gateway keeps no events to replay ({exc.message})", param="since"
            ) from None
        await _relay(req, sub, kinds)


async def _relay(req: HttpRequest, sub: Subscription, kinds: frozenset[str]) -> None:
    allowed: Callable[[], Awaitable[bool]] | None = req.scope.get(STILL_ALLOWED_SCOPE_KEY)
    async with anyio.create_task_group() as tg:
        await req.start(200, _HEADERS)
        await req.chunk(b": subscribed\n\n")
        tg.start_soon(_cancel_on_disconnect, req, tg.cancel_scope)
        events = aiter(sub)
        while True:
            with anyio.move_on_after(HEARTBEAT_S) as idle:
                try:
                    env = await anext(events)
                except StopAsyncIteration:
                    break
            if idle.cancelled_caught:
                if allowed is not None and not await allowed():
                    break
                await req.chunk(b": keepalive\n\n")
                continue
            kind = event_kind(env.subject)
            if kinds and kind not in kinds:
                continue
            if allowed is not None and not await allowed():
                break
            await req.chunk(
                b"event: "
                + kind.encode()
                + b"\ndata: "
                + event_json(env.subject, env.message)
                + b"\n\n"
            )
        tg.cancel_scope.cancel()
        await req.chunk(b"", more=False)


async def _cancel_on_disconnect(req: HttpRequest, scope: anyio.CancelScope) -> None:
    while (await req.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
