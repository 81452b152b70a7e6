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

:data:`pollers` gives a loop's poller while a server on it runs with one,
else None: a call site asks for its own loop's and holds only when there is one, so with busy
polling off nothing on the request path runs here, and a gateway never holds (nor takes away)
another loop's poller: several gateways may run in one process (tests, an embedding), each
with its own setting.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from schemas.process_config import MAX_BUSY_POLL_US

if TYPE_CHECKING:
    import asyncio

__all__ = ["BusyPoll", "install", "pollers", "uninstall"]


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


_installed: list[BusyPoll] = []  # every server's, in the order they were installed
pollers: dict[asyncio.AbstractEventLoop, BusyPoll] = {}
"""Each loop's poller (the first installed there still installed), or none.
Read, never written, outside this module: the request path's ``pollers.get(loop)`` runs no
code here (a function of this module would be one more file on its path)."""


def install(loop: asyncio.AbstractEventLoop, window_us: int) -> BusyPoll | None:
    """A poller of ``window_us`` (0: none) on ``loop``, until :func:`uninstall`; the poller,
    or None when off (another server's poller stays as it was). Raises ValueError past
    :data:`MAX_BUSY_POLL_US`."""
    if not 0 <= window_us <= MAX_BUSY_POLL_US:
        raise ValueError(f"a busy-poll window is 0 to {MAX_BUSY_POLL_US} µs, not {window_us}")
    if not window_us:
        return None
    poller = BusyPoll(loop, window_us)
    _installed.append(poller)
    pollers.setdefault(loop, poller)
    return poller


def uninstall(poller: BusyPoll | None) -> None:
    """Stop ``poller`` holding its loop: :data:`pollers` gives the loop's next installed
    poller, if another server on it has one, else none. Others' pollers stay."""
    if poller is None or poller not in _installed:
        return
    _installed.remove(poller)
    loop = poller._loop
    if pollers.get(loop) is poller:
        del pollers[loop]
        if (heir := next((p for p in _installed if p._loop is loop), None)) is not None:
            pollers[loop] = heir
