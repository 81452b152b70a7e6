"""Unit tests of the actor base and the supervisor, and the scripted test actor they share."""

from __future__ import annotations

import secrets
from collections import Counter
from typing import TYPE_CHECKING, TypeVar

import anyio

from actors import Actor, ActorContext, Serve
from schemas import LogAppend, RouteNotFoundError, RoutePlan, RouteRequest, subjects

if TYPE_CHECKING:
    from bus import Bus, Envelope, Subscription
    from schemas import RequestCompleted

T = TypeVar("T")

WAIT = 5.0  # seconds a test waits for an event before it fails


class Journal:
    """Lifecycle entries in order, shared by test actors; tests await entries, never sleep."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self._serials: Counter[str] = Counter()
        self._changed = anyio.Event()

    def serial(self, name: str) -> int:
        """The next instance number of actor ``name`` (1 for the first instance)."""
        self._serials[name] += 1
        return self._serials[name]

    def add(self, entry: str) -> None:
        self.entries.append(entry)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, entry: str) -> None:
        """Return once ``entry`` was added. Raises TimeoutError after WAIT seconds."""
        with anyio.fail_after(WAIT):
            while entry not in self.entries:
                await self._changed.wait()


class EchoActor(Actor):
    """Answers ``RouteRequest(model=m)`` on ``model_route(name)`` with ``RoutePlan(reason=
    "<name>#<serial>")`` and journals ``msg:<m>``; special models script its behaviour. Its
    stop is journalled ``stop:<label>``, or ``retire:<label>`` when it stopped retired.

    Bus models: ``crash`` raises RuntimeError, ``missing`` raises RouteNotFoundError,
    ``exit`` stops the actor cleanly, ``hang`` blocks forever, ``block`` waits for
    ``release``, ``self:<x>`` / ``later:<x>`` send ``x`` to itself now / after 10 ms,
    ``fanout`` sends itself ``f0``, ``f1``, ``f2``. Local messages: ``crash``, ``exit``,
    ``bg-crash`` (a background task raises); anything else is journalled as ``local:<x>``.
    """

    def __init__(
        self,
        name: str = "echo",
        journal: Journal | None = None,
        *,
        script: tuple[str, ...] = (),
        fail_start: bool = False,
        mailbox_size: int = 1024,
    ) -> None:
        self.journal = journal or Journal()
        self.serial = self.journal.serial(name)
        self.name = name
        self.serves = (Serve(subjects.model_route(name)),)
        self.mailbox_size = mailbox_size
        self.label = f"{name}#{self.serial}"
        self.blocked = anyio.Event()
        self.release = anyio.Event()
        self._script = script
        self._fail_start = fail_start

    async def on_start(self, ctx: ActorContext) -> None:
        self.journal.add(f"start:{self.label}")
        if self._fail_start:
            raise RuntimeError(f"{self.label} cannot start")
        for msg in self._script:
            await ctx.send_self(msg)

    async def handle(self, env: Envelope) -> None:
        assert isinstance(env.message, RouteRequest)
        model = env.message.model
        if model == "crash":
            raise RuntimeError("boom")
        if model == "missing":
            raise RouteNotFoundError("no such model")
        if model == "exit":
            self.request_stop()
        elif model == "hang":
            self.blocked.set()
            await anyio.sleep_forever()
        elif model == "block":
            self.blocked.set()
            await self.release.wait()
        elif model.startswith("self:"):
            await self.ctx.send_self(model.removeprefix("self:"))
        elif model.startswith("later:"):
            self.ctx.call_later(0.01, model.removeprefix("later:"))
        elif model == "fanout":
            for i in range(3):
                await self.ctx.send_self(f"f{i}")
        self.journal.add(f"msg:{model}")
        await env.respond(RoutePlan(model=model, candidates=(), reason=self.label))

    async def handle_local(self, msg: object) -> None:
        if msg == "crash":
            raise RuntimeError("boom")
        if msg == "exit":
            self.request_stop()
        elif msg == "bg-crash":
            self.ctx.start_soon(self._explode)
        else:
            self.journal.add(f"local:{msg}")

    async def on_stop(self) -> None:
        self.journal.add(f"{'retire' if self.retired else 'stop'}:{self.label}")

    async def _explode(self) -> None:
        raise RuntimeError("background boom")


async def ask(bus: Bus, name: str, model: str = "hello") -> RoutePlan:
    """Request ``model`` from actor ``name``; return its RoutePlan. Raises on anything else."""
    reply = await bus.request(
        subjects.model_route(name), RouteRequest(model=model), reply_type=RoutePlan, timeout=WAIT
    )
    assert isinstance(reply, RoutePlan), reply
    return reply


async def next_event(sub: Subscription, kind: type[T], child: str | None = None) -> T:
    """The next message of type ``kind`` (about ``child``, when given) on ``sub``."""
    with anyio.fail_after(WAIT):
        async for env in sub:
            msg = env.message
            if isinstance(msg, kind) and (child is None or getattr(msg, "child", None) == child):
                return msg
    raise AssertionError(f"subscription {sub.subject} ended before a {kind.__name__}")


async def log(bus: Bus, *done: RequestCompleted) -> None:
    """Publish ``done`` to the StoreActor as the first batch of a sender of its own (as an
    ingress's log outbox sends them), not waiting for the answer."""
    batch = LogAppend(sender=f"test-{secrets.token_hex(4)}", seq=1, requests=done)
    await bus.publish(subjects.LOG_APPEND, batch)


class FakeClock:
    """A monotonic clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
