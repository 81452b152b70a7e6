"""The worker processes of ``llmgw serve --workers N``, as their supervisor keeps them.

:class:`WorkerPool` starts each worker (``python -m gateway.process.worker``, its
:class:`~gateway.process.worker.WorkerSpec` on its stdin, the pipe kept open: its end tells
the worker its supervisor is gone), waits for its ``ready`` line, restarts the dead after the
delay :class:`RestartBudget` gives (and gives up past its bound), and stops them all: SIGTERM,
they drain, SIGKILL after a grace period. A worker that lost the bus (exit code
:data:`~gateway.process.worker.EXIT_BUS_LOST`) while the run starts is started again too, and
waits for the bus, rather than the run failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

import msgspec

from gateway.process.worker import EXIT_BUS_LOST

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.process.running_config import RunningConfig
    from gateway.process.worker import WorkerSpec

logger = logging.getLogger("llmgw")

_READY_TIMEOUT_S = 60.0  # a worker answers /health within this or startup fails
_STOP_TIMEOUT_S = 15.0  # a worker drains within this after SIGTERM, else SIGKILL
_EXIT_WAIT_S = 5.0  # a worker that closed its stdout at startup has exited within this


class WorkersGaveUpError(Exception):
    """A worker died more often than its restart budget allows."""


class WorkerStartError(Exception):
    """A worker exited (or stayed silent) before it answered at startup; ``code``: its exit
    code (None: it did not exit)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def bus_lost(self) -> bool:
        """It could not join the bus, or the bus dropped while it started."""
        return self.code == EXIT_BUS_LOST


@dataclasses.dataclass
class RestartBudget:
    """When a dead worker may be restarted: after a delay doubling from ``initial`` up to
    ``ceiling`` with each restart in the last ``period`` seconds, and never more than
    ``intensity`` times in that window (the supervisor then gives up, like an OTP one)."""

    intensity: int = 5
    period: float = 60.0
    initial: float = 0.1
    ceiling: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _restarts: deque[float] = dataclasses.field(default_factory=deque)

    def next_delay(self) -> float | None:
        """Record a restart now; its delay in seconds, or None when the budget is spent."""
        now = self.clock()
        while self._restarts and now - self._restarts[0] >= self.period:
            self._restarts.popleft()
        if len(self._restarts) >= self.intensity:
            return None
        self._restarts.append(now)
        return float(min(self.ceiling, self.initial * 2 ** (len(self._restarts) - 1)))


class WorkerPool:
    """Owns the worker processes: starts them, restarts the dead, stops them."""

    def __init__(
        self,
        spec: WorkerSpec,
        count: int,
        env: dict[str, str],
        budget: Callable[[], RestartBudget] = RestartBudget,
        running: RunningConfig | None = None,
    ) -> None:
        self._spec = spec
        self._running = running
        self._env = env
        self._procs: list[asyncio.subprocess.Process | None] = [None] * count
        self._budgets = [budget() for _ in range(count)]
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [p.pid for p in self._procs if p is not None and p.returncode is None]

    async def start(self) -> None:
        """Start every worker; return once all answer. Raises WorkerStartError."""
        await asyncio.gather(*(self._first_start(slot) for slot in range(len(self._procs))))

    async def _first_start(self, slot: int) -> None:
        restart = False
        while True:
            try:
                await self._start(slot, restart=restart)
                return
            except WorkerStartError as exc:
                # The bus dropped under it (the actors wait for it to come back): another
                # waits for it too, rather than the whole gateway stopping.
                delay = self._budgets[slot].next_delay() if exc.bus_lost else None
                if delay is None:
                    raise
                logger.warning("%s; starting another in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            restart = True

    async def _start(self, slot: int, restart: bool = False) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway.process.worker"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
        )
        self._procs[slot] = proc
        assert proc.stdin is not None and proc.stdout is not None
        # The pipe stays open: its end tells the worker its supervisor is gone.
        spec = msgspec.structs.replace(self._spec, wait_for_bus=restart, slot=slot + 1)
        if self._running is not None:
            spec = msgspec.structs.replace(spec, config_text=self._running.text)
        proc.stdin.write(msgspec.json.encode(spec) + b"\n")
        await proc.stdin.drain()
        try:
            # A restart may wait for the bus (the whole gateway does): it answers, or exits.
            timeout = None if restart else _READY_TIMEOUT_S
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        except TimeoutError:
            line = None
        if line is None or not line.startswith(b"ready "):
            code = None
            if line is not None:  # its stdout ended: it is exiting
                with contextlib.suppress(TimeoutError):
                    code = await asyncio.wait_for(proc.wait(), _EXIT_WAIT_S)
            why = "did not answer in time" if line is None else _ended(code)
            raise WorkerStartError(f"worker {slot + 1} (pid {proc.pid}) {why} while starting", code)
        logger.info("worker %d serving (pid %d)", slot + 1, proc.pid)

    async def watch(self) -> None:
        """Restart workers as they die. Raises WorkersGaveUpError when a budget is spent."""
        await asyncio.gather(*(self._watch(slot) for slot in range(len(self._procs))))

    async def _watch(self, slot: int) -> None:
        starting = False  # the process watched is a restart that has not answered yet
        while True:
            proc = self._procs[slot]
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            how = _ended(code) + (" while starting" if starting else "")
            delay = self._budgets[slot].next_delay()
            if delay is None:
                raise WorkersGaveUpError(
                    f"worker {slot + 1} keeps dying: {self._budgets[slot].intensity + 1} "
                    f"times within {self._budgets[slot].period:g}s (last: it {how})"
                )
            logger.warning(
                "worker %d (pid %d) %s; restarting in %.1fs", slot + 1, proc.pid, how, delay
            )
            await asyncio.sleep(delay)
            try:
                await self._start(slot, restart=True)
                starting = False
            except WorkerStartError:
                starting = True  # it has exited: said, and counted, as the loop goes round

    async def aclose(self) -> None:
        """Stop every worker: SIGTERM (they drain), SIGKILL after a grace period."""
        self._stopping = True
        live = [p for p in self._procs if p is not None and p.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in live:
            try:
                await asyncio.wait_for(proc.wait(), _STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for each in self._procs:
            if each is not None and each.stdin is not None:
                each.stdin.close()


def _ended(code: int | None) -> str:
    """How a worker's process ended, by its exit code (None: not known)."""
    if code is None:
        return "exited"
    if code == EXIT_BUS_LOST:
        return "lost the bus"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
