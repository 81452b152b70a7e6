"""Busy polling (``server.busy_poll_us``, off by default): the event loop keeps polling for I/O
instead of sleeping for a few hundred microseconds after each write to a client or an upstream,
when an answer or the client's next request is likely to follow soon.

Why: a virtual machine whose host halts an idle vCPU at once (``guest_halt_poll_ns`` 0) pays a
wake-up of the halted vCPU, and the cold caches after it, for every event that ends a wait.
At concurrency 1 a request waits twice (for the upstream's answer, then for the client's next
request), and those two wake-ups cost more than the gateway's own work (README, Benchmark).
HAProxy's ``busy-polling`` answers the same problem the same way; here the polling is bounded:
it stops ``window`` after the last write, so an idle gateway sleeps as before.

The cost is CPU: while a window is open the loop's core is busy (CPU figures, a container's CPU
quota and an autoscaler reading them all see it), and under load nothing changes (the loop has
work anyway). A window never delays work: each poll returns what is ready at once.

:data:`current` is the process's poller while a server runs with it (one event loop serves
per process), else None: a call site reads it and holds only when it is set, so with busy
polling off nothing on the request path runs here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from schemas.process_config import MAX_BUSY_POLL_US

if TYPE_CHECKING:
    import asyncio

__all__ = ["BusyPoll", "current", "install", "uninstall"]


class BusyPoll:
    """Owns one event loop's polling window: :meth:`hold` opens or extends it; while it is
    open one callback re-queues itself each loop iteration, so the loop polls with a zero
    timeout instead of sleeping. ``holds`` and ``spins``: the holds and the iterations polled
    so far."""

    __slots__ = ("_loop", "_spinning", "_until", "holds", "spins", "window")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int) -> None:
        self._loop = loop
        self.window = window_us / 1_000_000
        self._until = 0.0
        self._spinning = False
        self.spins = 0
        self.holds = 0

    @property
    def spinning(self) -> bool:
        """True while a window is open."""
        return self._spinning

    def hold(self) -> None:
        """Keep the loop polling until ``window`` from now (call on the loop's thread)."""
        self._until = time.monotonic() + self.window
        self.holds += 1
        if not self._spinning:
            self._spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        if time.monotonic() < self._until:
            self.spins += 1
            self._loop.call_soon(self._spin)
        else:
            self._spinning = False


current: BusyPoll | None = None


def install(loop: asyncio.AbstractEventLoop, window_us: int) -> BusyPoll | None:
    """Make a poller of ``window_us`` (0: none) on ``loop`` the process's :data:`current`;
    the poller, or None when off. Raises ValueError past :data:`MAX_BUSY_POLL_US`."""
    global current
    if not 0 <= window_us <= MAX_BUSY_POLL_US:
        raise ValueError(f"a busy-poll window is 0 to {MAX_BUSY_POLL_US} µs, not {window_us}")
    current = BusyPoll(loop, window_us) if window_us else None
    return current


def uninstall(poller: BusyPoll | None) -> None:
    """Stop ``poller`` holding the loop: :data:`current` is None again if it was this one."""
    global current
    if poller is not None and current is poller:
        current = None
