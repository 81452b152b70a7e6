"""Supervisors (OTP vocabulary): start children in order, restart them, stop them in reverse.

What a supervisor is told about its children (``ChildSpec``, ``Restart``, ``Strategy``) is in
``actors/child_spec.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus

from actors.child_spec import ChildSpec, Restart, Strategy
from schemas import ChildFailed, ChildRestarted, ChildStarted, SupervisorGaveUp, subjects

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from actors.base import Actor
    from bus import Bus
    from schemas import Message

logger = logging.getLogger(__name__)

_PUBLISH_TIMEOUT = 1.0  # a supervisor event is worth less than a supervisor stuck on the bus


class SupervisorGaveUpError(Exception):
    """More than ``intensity`` restarts within ``period`` seconds; every child was stopped.

    ``__cause__`` is the crash that tipped it over.
    """

    def __init__(self, supervisor: str, restarts: int, period: float) -> None:
        super().__init__(
            f"supervisor {supervisor!r} gave up: {restarts} restarts within {period:g}s"
        )
        self.supervisor = supervisor
        self.restarts = restarts
        self.period = period


class _Child:
    """One incarnation of a child: its task's cancel scope, readiness and exit."""

    __slots__ = ("done", "error", "instance", "ready", "scope", "settled", "spec", "stopping")

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.instance: Actor | Supervisor | None = None
        self.scope = anyio.CancelScope()
        self.settled = anyio.Event()  # ready or exited
        self.done = anyio.Event()
        self.ready = False
        self.stopping = False  # its exit was asked for, so it is not a failure
        self.error: Exception | None = None


class _Readiness(TaskStatus[object]):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def started(self, value: object = None) -> None:
        self._child.ready = True
        self._child.settled.set()


class _FutureStatus(TaskStatus[object]):
    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def started(self, value: object = None) -> None:
        if not self._future.done():
            self._future.set_result(None)


class Supervisor:
    """Owns its children's lifecycles; itself a child of another Supervisor, or the root.

    As a child it runs through ``run``/``request_stop`` like an Actor; as the root through
    ``start``/``stop``/``wait``. ``run`` (and ``wait``) raise SupervisorGaveUpError after too
    many restarts, and the exception of a child that failed its first start. ValueError on a
    bad configuration.
    """

    def __init__(
        self,
        name: str,
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        intensity: int = 3,
        period: float = 5.0,
        children: Iterable[ChildSpec | Supervisor] = (),
        clock: Callable[[], float] | None = None,
    ) -> None:
        if intensity < 0 or period <= 0:
            raise ValueError(f"supervisor {name!r}: need intensity >= 0 and period > 0")
        self.name = name
        self.strategy = strategy
        self.intensity = intensity
        self.period = period
        items = list(children)
        self._specs = [c if isinstance(c, ChildSpec) else _spec_for(c) for c in items]
        self._nested = {c.name: c for c in items if isinstance(c, Supervisor)}
        names = [s.name for s in self._specs]
        if len(set(names)) != len(names):
            raise ValueError(f"supervisor {name!r}: duplicate child names in {names}")
        self._own_clock = clock
        self._clock: Callable[[], float] = clock or time.monotonic
        self._bus: Bus | None = None
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream[_Child | None] | None = None
        self._children: dict[str, _Child] = {}
        self._finished: set[str] = set()
        self._restarts: deque[float] = deque()
        self._restart_counts: Counter[str] = Counter()
        self._stop_requested = False
        self._retiring = False  # this stop is a retirement (request_stop), passed down
        self._task: asyncio.Task[None] | None = None
        # Serialises changes to the children: exits, restarts, add/remove/replace, stop.
        self._lock = anyio.Lock()

    # -- root lifecycle -------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        """Start the tree in a background task; return once every child serves.

        Raises the exception of a child that failed to start (the tree is then stopped), and
        RuntimeError if this supervisor is already running.
        """
        if self._task is not None and not self._task.done():
            raise RuntimeError(f"supervisor {self.name!r} is already running")
        self._stop_requested = False
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            self.run(bus, task_status=_FutureStatus(ready)), name=f"supervisor:{self.name}"
        )
        self._task = task
        try:
            await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not ready.done() and not task.done():
                task.cancel()  # our caller gave up waiting: do not leave a half-started tree
        if not ready.done():
            ready.cancel()
            task.result()

    async def stop(self) -> None:
        """Stop every child in reverse order and wait until the tree is down; idempotent.

        Never raises the tree's outcome (a give-up, a failed start): ``wait`` reports that.
        """
        task = self._task
        if task is None or task.done():
            return
        self.request_stop()
        await asyncio.wait({task})

    async def wait(self) -> None:
        """Return once the tree stopped. Raises SupervisorGaveUpError if it gave up."""
        if self._task is None:
            raise RuntimeError(f"supervisor {self.name!r} was never started")
        await asyncio.wait({self._task})
        self._task.result()

    def child(self, name: str) -> Actor | Supervisor:
        """The running instance of child ``name``. Raises KeyError when none is running."""
        c = self._children.get(name)
        if c is None or not c.ready or c.done.is_set() or c.instance is None:
            raise KeyError(f"supervisor {self.name!r} has no running child {name!r}")
        return c.instance

    # -- changing the children of a running supervisor -----------------------------------

    @property
    def specs(self) -> tuple[ChildSpec, ...]:
        """The children's specs in start order (stop order is the reverse)."""
        return tuple(self._specs)

    def nested(self, name: str) -> Supervisor | None:
        """Child ``name`` when it is a Supervisor (running or not), else None."""
        return self._nested.get(name)

    async def add_child(self, child: ChildSpec | Supervisor, *, index: int | None = None) -> None:
        """Start a new child at ``index`` of the list (default: last) while running.

        Raises ValueError when the name is taken, RuntimeError when not running, and the
        child's own exception when it fails to start (it is then forgotten).
        """
        spec = child if isinstance(child, ChildSpec) else _spec_for(child)
        async with self._lock:
            self._check_running()
            if any(s.name == spec.name for s in self._specs):
                raise ValueError(f"supervisor {self.name!r} already has a child {spec.name!r}")
            self._specs.insert(len(self._specs) if index is None else index, spec)
            if isinstance(child, Supervisor):
                self._nested[spec.name] = child
            self._finished.discard(spec.name)
            error = await self._start_child(spec)
            if error is not None:
                self._specs.remove(spec)
                self._nested.pop(spec.name, None)
                self._children.pop(spec.name, None)
                raise error
        await self._publish(ChildStarted(supervisor=self.name, child=spec.name))

    async def remove_child(self, name: str, *, retire: bool = False) -> None:
        """Stop child ``name`` (within its shutdown time) and forget it.

        ``retire``: the config no longer has it (a reload removed it), as opposed to a unit
        moving to another host: the child (every actor below it) stops retired, see
        ``Actor.request_stop``. Raises KeyError when there is no such child.
        """
        async with self._lock:
            spec = self._spec_named(name)
            self._specs.remove(spec)
            self._nested.pop(name, None)
            self._finished.discard(name)
            child = self._children.pop(name, None)
            if child is not None:
                await self._stop_child(child, retire=retire)

    async def replace_child(self, spec: ChildSpec) -> None:
        """Start ``spec`` in place of the child of the same name, then stop the old one.

        Make before break: both serve for a moment, so the child's subjects never go
        unanswered. An ``exclusive`` child (either spec) is replaced break before make
        instead: the old one stops (its ``on_stop`` saves its final state) before the new one
        starts (and loads it), so there is never a moment with two owners; its subjects go
        unanswered in between. Raises KeyError (no such child), RuntimeError (not running),
        and the new child's exception when it fails to start (the old one then keeps
        running; an exclusive one is started again from its old spec).
        """
        async with self._lock:
            self._check_running()
            old_spec = self._spec_named(spec.name)
            old = self._children.get(spec.name)
            exclusive = spec.exclusive or old_spec.exclusive
            if exclusive and old is not None:
                if old.instance is not None and not isinstance(old.instance, Supervisor):
                    old.instance.handing_over = True
                await self._stop_child(old)
            error = await self._start_child(spec)
            if error is not None:
                if exclusive and old is not None:
                    if await self._start_child(old_spec) is not None:
                        logger.error(
                            "supervisor %s: %s could not be started again after its "
                            "replacement failed",
                            self.name,
                            spec.name,
                        )
                elif old is not None:
                    self._children[spec.name] = old
                else:
                    self._children.pop(spec.name, None)
                raise error
            self._specs[self._specs.index(old_spec)] = spec
            self._nested.pop(spec.name, None)
            self._finished.discard(spec.name)
            if old is not None and not exclusive:
                await self._stop_child(old)
        await self._publish(ChildStarted(supervisor=self.name, child=spec.name))

    def _spec_named(self, name: str) -> ChildSpec:
        for s in self._specs:
            if s.name == name:
                return s
        raise KeyError(f"supervisor {self.name!r} has no child {name!r}")

    def _check_running(self) -> None:
        if self._tg is None or self._stop_requested:
            raise RuntimeError(f"supervisor {self.name!r} is not running")

    # -- the child interface --------------------------------------------------------------

    def request_stop(self, *, retire: bool = False) -> None:
        """Ask ``run`` to stop every child (reverse order) and return; never waits.
        ``retire``: each child is stopped retired (``Actor.request_stop``)."""
        self._retiring = self._retiring or retire
        self._stop_requested = True
        if self._inbox is not None:
            self._inbox.send_nowait(None)

    async def run(
        self,
        bus: Bus,
        *,
        clock: Callable[[], float] | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the children, supervise them until ``request_stop``, stop them.

        ``clock`` (the parent's) is used unless this supervisor was given its own.
        """
        self._bus = bus
        self._clock = self._own_clock or clock or time.monotonic
        self._restarts.clear()
        self._restart_counts.clear()
        self._finished.clear()
        send, recv = anyio.create_memory_object_stream[_Child | None](math.inf)
        failure: Exception | None = None
        try:
            with send, recv:
                self._inbox = send
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    failure = await self._start_all()
                    if failure is None:
                        task_status.started()
                        failure = await self._supervise(recv)
                    async with self._lock:
                        await self._stop_all()
        finally:
            self._inbox = None
            self._tg = None
            self._stop_requested = self._retiring = False
        if failure is not None:
            raise failure

    # -- supervision ----------------------------------------------------------------------

    async def _start_all(self) -> Exception | None:
        for spec in self._specs:
            error = await self._start_child(spec)
            if error is not None:
                logger.error("supervisor %s: child %s failed to start", self.name, spec.name)
                return error
            await self._publish(ChildStarted(supervisor=self.name, child=spec.name))
        return None

    async def _supervise(self, recv: MemoryObjectReceiveStream[_Child | None]) -> Exception | None:
        if self._stop_requested:
            return None
        async for child in recv:
            if child is None:
                return None
            if child.stopping or self._children.get(child.spec.name) is not child:
                continue  # an exit we asked for, or of an incarnation already replaced
            async with self._lock:
                gave_up = await self._on_exit(child)
            if gave_up is not None:
                return gave_up
        return None

    async def _on_exit(self, child: _Child) -> Exception | None:
        spec, error = child.spec, child.error
        if error is not None:
            logger.warning(
                "supervisor %s: child %s crashed: %s",
                self.name,
                spec.name,
                _describe(error),
                exc_info=error,
            )
            await self._publish(
                ChildFailed(supervisor=self.name, child=spec.name, error=_describe(error))
            )
        if spec.restart is Restart.TEMPORARY or (
            spec.restart is Restart.TRANSIENT and error is None
        ):
            self._finished.add(spec.name)
            del self._children[spec.name]
            return None
        now = self._clock()
        self._restarts.append(now)
        while self._restarts and self._restarts[0] <= now - self.period:
            self._restarts.popleft()
        if len(self._restarts) > self.intensity:
            logger.error(
                "supervisor %s: more than %d restarts within %gs; stopping every child",
                self.name,
                self.intensity,
                self.period,
            )
            restarts = len(self._restarts)
            await self._publish(
                SupervisorGaveUp(supervisor=self.name, restarts=restarts, period=self.period)
            )
            gave_up = SupervisorGaveUpError(self.name, restarts, self.period)
            gave_up.__cause__ = error
            return gave_up
        await self._restart(spec)
        return None

    async def _restart(self, failed: ChildSpec) -> None:
        active = [s for s in self._specs if s.name not in self._finished]
        if self.strategy is Strategy.ONE_FOR_ONE:
            group = [failed]
        elif self.strategy is Strategy.ONE_FOR_ALL:
            group = active
        else:
            group = active[active.index(failed) :]
        for spec in reversed(group):
            old = self._children.get(spec.name)
            if old is not None:
                await self._stop_child(old)
        for spec in group:
            self._restart_counts[spec.name] += 1
            count = self._restart_counts[spec.name]
            logger.warning("supervisor %s: restarting %s (#%d)", self.name, spec.name, count)
            if await self._start_child(spec) is not None:
                # Its exit is queued: handling it restarts this group again, counted as such.
                return
            await self._publish(
                ChildRestarted(supervisor=self.name, child=spec.name, restarts=count)
            )

    async def _start_child(self, spec: ChildSpec) -> Exception | None:
        assert self._tg is not None
        child = _Child(spec)
        self._children[spec.name] = child
        self._tg.start_soon(self._run_child, child, name=f"{self.name}/{spec.name}")
        await child.settled.wait()
        if child.ready:
            return None
        return child.error or RuntimeError(f"child {spec.name!r} exited before it was ready")

    async def _run_child(self, child: _Child) -> None:
        assert self._bus is not None and self._inbox is not None
        try:
            with child.scope:
                child.instance = child.spec.factory()
                await child.instance.run(
                    self._bus, clock=self._clock, task_status=_Readiness(child)
                )
        except Exception as exc:  # a child's crash is this supervisor's to decide on
            child.error = exc
        child.done.set()
        child.settled.set()
        self._inbox.send_nowait(child)

    async def _stop_child(self, child: _Child, *, retire: bool = False) -> None:
        child.stopping = True
        if child.done.is_set():
            return
        if child.instance is not None:
            child.instance.request_stop(retire=retire)
        with anyio.move_on_after(child.spec.shutdown):
            await child.done.wait()
        if not child.done.is_set():
            logger.warning(
                "supervisor %s: child %s did not stop within %gs; cancelling it",
                self.name,
                child.spec.name,
                child.spec.shutdown,
            )
            child.scope.cancel()
            await child.done.wait()

    async def _stop_all(self) -> None:
        for spec in reversed(self._specs):
            child = self._children.pop(spec.name, None)
            if child is not None:
                await self._stop_child(child, retire=self._retiring)

    async def _publish(self, msg: Message) -> None:
        assert self._bus is not None
        try:
            with anyio.move_on_after(_PUBLISH_TIMEOUT) as scope:
                await self._bus.publish(subjects.supervisor_event(self.name), msg)
        except Exception as exc:  # an unpublished event must not take the supervisor down
            logger.warning("supervisor %s: could not publish %r: %s", self.name, msg, exc)
            return
        if scope.cancelled_caught:
            logger.warning("supervisor %s: publishing %r timed out", self.name, msg)


def _spec_for(sup: Supervisor) -> ChildSpec:
    # A nested supervisor bounds its children's shutdown itself, so its own is unbounded.
    return ChildSpec(sup.name, lambda: sup, shutdown=math.inf)


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
