"""Coarse deadlines for the request path, and the rest of a coroutine that has suspended.

``asyncio.timeout`` arms a loop timer of its own each time (about 8 µs to enter and leave
under uvloop, measured with ``python -m tests.benchmarks.bench``'s machine idle), and the
request path opens one for each read of a streamed answer. A :func:`deadline` instead joins
the set of its 10 ms tick on one timer the event loop's deadlines share (a set add, and a
discard on leaving): the timer fires at the earliest tick that holds a set and cancels the
tasks whose deadline passed. A deadline fires at most one tick (plus the loop's lag) late,
never early; what it bounds is seconds long, a client's body, a first byte, a stalled stream.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Coroutine, Generator

__all__ = ["TICK", "Deadline", "Resumed", "deadline"]

T = TypeVar("T")

TICK = 0.01
"""Seconds between the instants the shared timer can fire at."""
_NEVER = float("inf")


class _Wheel:
    """Owns one event loop's deadlines: their sets by tick and the one timer that fires
    them. Touched only from its loop's thread."""

    __slots__ = ("_armed", "_buckets", "_ticks", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._buckets: dict[int, set[Deadline]] = {}
        self._ticks: list[int] = []  # the keys of _buckets, a heap
        self._timer: asyncio.TimerHandle | None = None
        self._armed: float = _NEVER  # the tick the timer is set for

    def join(self, scope: Deadline, when: float) -> set[Deadline]:
        """Put ``scope`` in the set of the first tick at or after loop time ``when``; that
        set (the scope leaves by discarding itself from it)."""
        tick = int(when / TICK) + 1
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = set()
            heapq.heappush(self._ticks, tick)
            if tick < self._armed:
                self._arm(tick)
        bucket.add(scope)
        return bucket

    @property
    def pending(self) -> int:
        """Deadlines still waiting (those left early included until their tick)."""
        return sum(len(b) for b in self._buckets.values())

    @property
    def armed(self) -> bool:
        """Whether the timer is set (it is not once no tick holds a set)."""
        return self._timer is not None

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = tick
        self._timer = self.loop.call_at(tick * TICK, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed = None, _NEVER
        now = self.loop.time()
        ticks, buckets = self._ticks, self._buckets
        # A timer may fire a little before its time (the loop's clock resolution): a tick
        # not yet reached waits for the next arming.
        while ticks and ticks[0] * TICK <= now:
            for scope in buckets.pop(heapq.heappop(ticks)):
                scope.expire()
        if ticks:
            self._arm(ticks[0])


_wheel: _Wheel | None = None


def _wheel_of(loop: asyncio.AbstractEventLoop) -> _Wheel:
    global _wheel
    wheel = _wheel
    if wheel is None or wheel.loop is not loop:
        # Another loop (a test's, a thread's): its own wheel; one left behind still fires
        # the deadlines it holds (its timer keeps it).
        wheel = _wheel = _Wheel(loop)
    return wheel


class Deadline:
    """A ``with`` block cancelled once ``seconds`` have passed since it was entered, leaving
    by TimeoutError, as ``asyncio.timeout`` does: a cancellation from elsewhere still
    leaves as CancelledError. Entered in a task, on that task's loop."""

    __slots__ = ("_bucket", "_cancelling", "_expired", "_seconds", "_task")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._expired = False

    def __enter__(self) -> Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline must be entered in a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._bucket = _wheel_of(loop).join(self, loop.time() + self._seconds)
        return self

    def expire(self) -> None:
        """The deadline passed: cancel the task (the block leaves by TimeoutError)."""
        self._expired = True
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        self._bucket.discard(self)
        if self._expired:
            # As asyncio.timeout: this scope's cancellation is taken back, and only when no
            # other is pending does the block leave by TimeoutError.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        """Whether the deadline passed while the block ran."""
        return self._expired


def deadline(seconds: float) -> Deadline:
    """A block bounded to ``seconds`` on the loop's shared coarse timer (see the module)."""
    return Deadline(seconds)


class Resumed(Generic[T]):
    """The rest of a coroutine that already yielded ``first`` to the event loop: awaiting
    this finishes it (what the task sends or throws is passed on). For a step that usually
    completes at once: drive it with ``coro.send(None)`` and, only when it suspends, await
    the rest under a shield or a deadline, which then cost nothing in the usual case."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, T], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, T]:
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task: passed on to the coroutine
                try:
                    value = coro.throw(exc)
                except StopIteration as done:
                    return cast("T", done.value)
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as done:
                    return cast("T", done.value)
