"""The actor base: one mailbox, one message at a time, hooks for start, handle and stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from bus import BusClosedError, Mailbox
from schemas import GatewayError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskGroup, TaskStatus

    from bus import Bus, Envelope, Subscription
    from schemas import Message

logger = logging.getLogger(__name__)

# Messages an actor handles in a row without the loop getting a turn: with a busy mailbox a
# get() never suspends, and the rest of the process (the ingress above all) must not starve.
_FAIR_SHARE = 32


@dataclass(frozen=True)
class Serve:
    """One subscription of an actor; ``queue`` names a queue group shared across processes."""

    subject: str
    queue: str | None = None


class Cancellable(Protocol):
    """What ``ActorContext.call_later`` returns."""

    def cancel(self) -> None:
        """Stop the pending action; a no-op once it happened."""
        ...


class _Timer:
    """A pending ``call_later``: cancelling it also discards its message if already queued."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.scope.cancel()


@dataclass(slots=True)
class _Local:
    """A message an actor sent itself; it goes to ``handle_local``, never to ``handle``."""

    msg: object
    timer: _Timer | None = None


class _Wake:
    """Put in an idle actor's empty mailbox by ``request_stop`` to end its wait."""


_WAKE = _Wake()


class ActorContext:
    """What a running actor may use: the bus, its name, a clock, its mailbox and task group.

    Owns the actor's local-message overflow. Everything started through it (timers,
    ``start_soon`` tasks) ends when the actor stops.
    """

    def __init__(
        self,
        *,
        bus: Bus,
        name: str,
        clock: Callable[[], float],
        task_group: TaskGroup,
        mailbox: Mailbox[Envelope | _Local | _Wake],
    ) -> None:
        self.bus = bus
        self.name = name
        self.clock = clock
        self._tg = task_group
        self._mailbox = mailbox
        self._overflow: deque[_Local] = deque()

    async def publish(self, subject: str, msg: Message) -> None:
        """Publish ``msg`` on the bus. Raises what ``Bus.publish`` raises (BusClosedError)."""
        await self.bus.publish(subject, msg)

    async def send_self(self, msg: object) -> None:
        """Queue ``msg`` for this actor's ``handle_local``, after what is already queued.

        Never waits for mailbox room: a handler sending to itself while the mailbox is full
        would otherwise wait for itself forever. Local messages keep their order.
        """
        self._enqueue(_Local(msg))

    def call_later(self, delay: float, msg: object) -> Cancellable:
        """Send ``msg`` to ``handle_local`` after ``delay`` seconds (real time) unless cancelled.

        Cancelling also discards the message if it already sits in the mailbox.
        """
        timer = _Timer()
        self._tg.start_soon(self._fire, delay, _Local(msg, timer), name=f"{self.name}:timer")
        return timer

    def start_soon(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` in the background until the actor stops; its exception crashes the actor."""
        self._tg.start_soon(_await, fn, name=f"{self.name}:task")

    async def _fire(self, delay: float, item: _Local) -> None:
        assert item.timer is not None
        with item.timer.scope:
            await anyio.sleep(delay)
            self._enqueue(item)

    def _enqueue(self, item: _Local) -> None:
        if not self._overflow:
            try:
                self._mailbox.put_nowait(item)
                return
            except asyncio.QueueFull:
                pass
        self._overflow.append(item)
        if len(self._overflow) == 1:
            self._tg.start_soon(self._drain_overflow, name=f"{self.name}:overflow")

    async def _drain_overflow(self) -> None:
        while self._overflow:
            await self._mailbox.put(self._overflow[0])
            self._overflow.popleft()


class Actor:
    """Owns its state; sees one message at a time, so that state needs no locks.

    Subclasses set ``name`` and ``serves`` (usually in ``__init__``) and override the hooks.
    ``run`` (called by a Supervisor) raises whatever crashed the actor: an exception from
    ``on_start``, ``handle`` (other than GatewayError), ``handle_local``, a ``start_soon``
    task, or ``BusClosedError`` when a subscription ends while the actor still serves.
    """

    name: str
    serves: tuple[Serve, ...] = ()
    mailbox_size: int = 1024
    ctx: ActorContext
    # Set by ``request_stop(retire=True)``: see there; ``on_stop`` reads it.
    retired: bool = False
    # Set by a supervisor replacing this exclusive child in its process: ``on_stop`` may
    # hand what only its memory holds to its successor, which starts right after it.
    handing_over: bool = False

    _stop_requested: bool = False
    _mailbox: Mailbox[Envelope | _Local | _Wake] | None = None

    async def on_start(self, ctx: ActorContext) -> None:
        """Build state before any message arrives; ``self.ctx`` is already set."""

    async def handle(self, env: Envelope) -> None:
        """Handle one bus message; a GatewayError raised here is answered as an ErrorReply."""
        raise NotImplementedError(f"{type(self).__name__} serves subjects but has no handle()")

    async def handle_local(self, msg: object) -> None:
        """Handle one message from ``send_self`` or ``call_later``."""
        raise NotImplementedError(f"{type(self).__name__} got a local message: {msg!r}")

    async def on_stop(self) -> None:
        """Release resources.

        Runs after a clean stop and, best effort, after a crash (its own failure is then logged
        and the crash propagates), once the subscriptions and background tasks have ended. It
        does not run when ``on_start`` failed or when the actor is cancelled (it ignored stop
        past its shutdown time).
        """

    def request_stop(self, *, retire: bool = False) -> None:
        """Ask ``run`` to return cleanly once the message in hand is handled; never waits.

        ``retire``: it stops because the running config no longer has it (a reload removed
        it), not to be restarted, replaced or moved to another host; ``on_stop`` may then
        drop what only the callers of the moment needed (a capacity pool's leases, whose
        releases can no longer reach an owner), keeping what outlives them.
        """
        self.retired = self.retired or retire
        self._stop_requested = True
        if self._mailbox is not None:
            try:  # an idle actor waits on an empty mailbox; a busy one sees the flag next
                self._mailbox.put_nowait(_WAKE)
            except asyncio.QueueFull:
                pass

    async def run(
        self,
        bus: Bus,
        *,
        clock: Callable[[], float] | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start, serve until ``request_stop``, stop. Signals ``task_status`` once serving.

        Raises the exception that crashed the actor (see the class docstring).
        """
        mailbox: Mailbox[Envelope | _Local | _Wake] = Mailbox(self.mailbox_size)
        self._mailbox = mailbox
        started = False
        try:
            async with anyio.create_task_group() as background:
                self.ctx = ActorContext(
                    bus=bus,
                    name=self.name,
                    clock=clock or time.monotonic,
                    task_group=background,
                    mailbox=mailbox,
                )
                await self.on_start(self.ctx)
                started = True
                await self._serve(bus, mailbox, task_status)
                background.cancel_scope.cancel()
        except Exception as exc:
            if started:
                await self._stop_after_crash()
            sole = _sole(exc)
            if sole is exc:
                raise
            # Task groups wrap a single crash in groups; the supervisor reports the crash.
            raise sole from None
        finally:
            self._mailbox = None
        await self.on_stop()

    async def _serve(
        self,
        bus: Bus,
        mailbox: Mailbox[Envelope | _Local | _Wake],
        task_status: TaskStatus[None],
    ) -> None:
        async with AsyncExitStack() as subscriptions:
            subs = [
                await subscriptions.enter_async_context(bus.subscribe(s.subject, queue=s.queue))
                for s in self.serves
            ]
            # Forwarders live in their own group so they end before the subscriptions close.
            async with anyio.create_task_group() as forwarders:
                for sub in subs:
                    forwarders.start_soon(self._forward, sub, mailbox, name=f"{self.name}:forward")
                task_status.started()
                await self._loop(mailbox)
                forwarders.cancel_scope.cancel()

    async def _forward(
        self, sub: Subscription, mailbox: Mailbox[Envelope | _Local | _Wake]
    ) -> None:
        # Straight into the mailbox while it has room; when full, the subscription queues and
        # waits for room: backpressure, not loss.
        await sub.feed(mailbox)
        raise BusClosedError(f"actor {self.name}: subscription to {sub.subject} ended")

    async def _loop(self, mailbox: Mailbox[Envelope | _Local | _Wake]) -> None:
        # The bus messages are handled inline (not through a helper coroutine) and a waiting
        # item is taken without a get() coroutine: per message, two coroutine objects fewer.
        in_a_row = 0
        while not self._stop_requested:
            if mailbox.empty():
                in_a_row = 0  # get() suspends: the loop gets its turn
                item = await mailbox.get()
            elif (in_a_row := in_a_row + 1) >= _FAIR_SHARE:
                in_a_row = 0
                await asyncio.sleep(0)
                item = mailbox.take()  # the one consumer: what was there still is
            else:
                item = mailbox.take()
            if self._stop_requested:
                return  # an item taken while stopping is dropped, like the rest of the mailbox
            if isinstance(item, _Local):
                await self._dispatch_local(item)
            elif not isinstance(item, _Wake):
                try:
                    await self.handle(item)
                except GatewayError as err:
                    if item.reply is None:
                        logger.warning(
                            "actor %s: event on %s failed: %s", self.name, item.subject, err
                        )
                    await item.respond(err.to_reply())

    async def _dispatch_local(self, item: _Local) -> None:
        if item.timer is not None and item.timer.cancelled:
            return
        try:
            await self.handle_local(item.msg)
        except GatewayError as err:
            logger.warning("actor %s: local message %r failed: %s", self.name, item.msg, err)

    async def _stop_after_crash(self) -> None:
        try:
            await self.on_stop()
        except Exception:
            logger.exception("actor %s: on_stop after a crash failed", self.name)


async def _await(fn: Callable[[], Awaitable[None]]) -> None:
    await fn()


def _sole(exc: Exception) -> Exception:
    """The one exception inside nested single-member groups, else ``exc`` itself."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
