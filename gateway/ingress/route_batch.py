"""Route requests sent together: those an ingress begins for one model in one turn of its
event loop go to the model's owner as one ``RouteBatch`` over NATS.

Under ``llmgw serve --workers N`` at concurrency, a worker begins several requests for the
same model in one turn of its loop (eight on average at concurrency 64 on two workers, counted
in the batches its NATS client writes), and each paid a NATS message both ways: encoded and
written, routed by nats-server, read and decoded by the actors host, its reply the same way
back. One ``RouteBatch`` per model and turn carries them all, answered by one
``RouteBatchReply`` (each request's plan, or the error it alone met, in order). On the
in-process bus a request is a hand-over to the owner's mailbox, with nothing to save: there
the route request goes out at once, as before (see :func:`route_asker`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Protocol

from bus import InProcessBus
from schemas import BusTimeoutError, ErrorReply, RouteBatch, RouteBatchReply, RoutePlan

if TYPE_CHECKING:
    from bus import Bus
    from schemas import RouteRequest

__all__ = ["BATCH_MAX", "AskRoute", "RouteBatcher", "route_asker"]

BATCH_MAX = 64
"""The most route requests one RouteBatch carries: its reply (a plan of a few candidates is
well under 2 KB) stays far below NATS's 1 MB message limit."""


class AskRoute(Protocol):
    """Send a route request to its model's owner (``subject``); the owner's answer. Raises
    what ``Bus.request`` raises (NoRespondersError, RequestTimeoutError, BusClosedError,
    CodecError)."""

    async def __call__(
        self, subject: str, route_req: RouteRequest, *, timeout: float
    ) -> RoutePlan | ErrorReply: ...


def route_asker(bus: Bus) -> AskRoute:
    """How this ingress asks for plans on ``bus``: batched per turn over NATS, one request at
    a time in process."""
    if isinstance(bus, InProcessBus):
        return functools.partial(bus.request, reply_type=RoutePlan)
    return RouteBatcher(bus).ask


_Asking = list[tuple["RouteRequest", "asyncio.Future[RoutePlan | ErrorReply]"]]


class RouteBatcher:
    """Owns the route requests begun in the current turn of the event loop, by subject, until
    they are sent, and the tasks sending them."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._pending: dict[str, _Asking] = {}
        self._timeout = 0.0  # the longest of the turn's (one config value in practice)
        self._flush_due = False
        self._sending: set[asyncio.Task[None]] = set()

    async def ask(
        self, subject: str, route_req: RouteRequest, *, timeout: float
    ) -> RoutePlan | ErrorReply:
        """``route_req``'s answer, sent with this turn's other requests to ``subject``. Raises
        what the batch's ``Bus.request`` raised (each request of the batch gets it)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[RoutePlan | ErrorReply] = loop.create_future()
        asking = self._pending.get(subject)
        if asking is None:
            asking = self._pending[subject] = []
        asking.append((route_req, answer))
        self._timeout = max(self._timeout, timeout)
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        return await answer

    def _flush(self) -> None:
        self._flush_due = False
        pending, self._pending = self._pending, {}
        timeout, self._timeout = self._timeout, 0.0
        loop = asyncio.get_running_loop()
        for subject, asked in pending.items():
            asking = [(r, answer) for r, answer in asked if not answer.done()]  # not gone
            for at in range(0, len(asking), BATCH_MAX):
                task = loop.create_task(self._send(subject, asking[at : at + BATCH_MAX], timeout))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, subject: str, asking: _Asking, timeout: float) -> None:
        try:
            replies = await self._answers(subject, tuple(r for r, _ in asking), timeout)
        except BaseException as exc:  # each asker raises it (cancelled: each is cancelled)
            for _, answer in asking:
                if not answer.done():
                    if isinstance(exc, asyncio.CancelledError):
                        answer.cancel()
                    else:
                        answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, answer), reply in zip(asking, replies, strict=True):
            if not answer.done():  # else its request went away meanwhile
                answer.set_result(reply)

    async def _answers(
        self, subject: str, requests: tuple[RouteRequest, ...], timeout: float
    ) -> tuple[RoutePlan | ErrorReply, ...]:
        """One answer per request, in order (a turn's only request is sent as it is)."""
        bus = self._bus
        if len(requests) == 1:
            return (await bus.request(subject, requests[0], reply_type=RoutePlan, timeout=timeout),)
        batch = RouteBatch(requests=requests)
        reply = await bus.request(subject, batch, reply_type=RouteBatchReply, timeout=timeout)
        if isinstance(reply, ErrorReply):  # the batch refused whole: each request is
            return (reply,) * len(requests)
        if len(reply.replies) != len(requests):
            err = BusTimeoutError(
                f"the model's owner answered {len(reply.replies)} of {len(requests)} requests"
            )
            return (err.to_reply(),) * len(requests)
        return reply.replies
