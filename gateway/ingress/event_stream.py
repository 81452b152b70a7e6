"""``GET /events``: the operator event stream (``llmgw.events.>``) as Server-Sent Events.

One frame per event: ``event: <kind>`` and ``data:`` the event as JSON with its ``kind`` and
``type``, the same lines ``llmgw events`` prints. ``?kind=circuit,config`` filters. A comment
line is sent once subscribed and every 15 s, so proxies keep the connection open. The stream
ends when the client goes away or the bus closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import anyio
import msgspec

from schemas import subjects

if TYPE_CHECKING:
    from bus import Bus
    from gateway.ingress.request import HttpRequest
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


def kinds_of(req: HttpRequest) -> frozenset[str]:
    """The ``kind`` filter of the query string (empty: every kind)."""
    query = parse_qs(bytes(req.scope.get("query_string", b"")).decode("latin-1"))
    return frozenset(k for v in query.get("kind", ()) for k in v.split(",") if k)


async def stream_events(req: HttpRequest, bus: Bus, kinds: frozenset[str]) -> None:
    """Relay events to ``req`` until the client leaves or the bus closes."""
    pattern = subjects.event(next(iter(kinds))) if len(kinds) == 1 else subjects.EVENTS_ANY
    async with bus.subscribe(pattern) as sub, anyio.create_task_group() as tg:
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
                await req.chunk(b": keepalive\n\n")
                continue
            kind = event_kind(env.subject)
            if kinds and kind not in kinds:
                continue
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
