"""An asyncio event loop on virtual time that jumps straight to its next timer when idle.

``loop.time()`` is virtual. Whenever no callback is ready, the loop polls its selector without
blocking and, finding nothing, moves virtual time to its earliest scheduled timer instead of
waiting for it (trio's ``MockClock(autojump_threshold=0)``). So every ``asyncio.sleep``,
``call_later``, ``wait_for`` and anyio timeout in the real code runs on virtual time, and a day
of traffic costs only the CPU its callbacks take.

Work done in other threads (an aiosqlite connection) arrives through
``call_soon_threadsafe``; a jump taken while such work is pending would make its completion
land at an arbitrary virtual time, so the loop counts those wake-ups (``thread_wakeups``) and
the replay checks it stays zero while traffic runs.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping
    from contextvars import Context

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_START = 1_000.0
"""Virtual time at creation: nonzero, so no reader mistakes it for "never"."""


class _JumpingSelector(selectors.BaseSelector):
    """Wraps the loop's real selector: polls it, and turns an idle wait into a jump."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._inner = inner
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or not self._loop.jumping:
            # Nothing scheduled at all: only another thread can wake the loop, so wait for it.
            return self._inner.select(timeout)
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock is virtual and jumps while ``jumping`` is True.

    ``jumping`` may be switched off (e.g. while something that waits on a thread starts up):
    then idle waits are real waits, and virtual time stands still.
    """

    def __init__(self) -> None:
        self._now = _START
        self.jumping = True
        self.thread_wakeups = 0
        super().__init__(selectors.DefaultSelector())
        inner = cast("selectors.BaseSelector", self._selector)  # type: ignore[has-type]
        self._selector = _JumpingSelector(inner, self)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time ``seconds`` forward (never back)."""
        if seconds > 0:
            self._now += seconds

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.Handle:
        self.thread_wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def run_virtual(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`, then close it. Raises
    RuntimeError in a thread whose event loop is running (use another thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        main.close()
        raise RuntimeError("run_virtual needs a thread with no running event loop")
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
