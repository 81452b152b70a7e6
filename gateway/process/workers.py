"""``llmgw serve --workers N``: the actors in this process, N ingress processes on one port.

Topology of one run (see the README): this supervisor process starts a private nats-server
(:mod:`gateway.process.embedded_nats`, unless ``--bus nats://`` names one), runs the actor
tree on it (role ``actors``: the local admin socket, SIGHUP reload, the request log), and
keeps N workers (:mod:`gateway.process.worker`, role ``ingress``) serving the HTTP port, each
on its own SO_REUSEPORT socket. It holds the port itself, bound but not listening, so the
port is known (``--port 0``) and stays reserved while a worker restarts. It prints the ready
line once every worker answers, restarts a worker that dies (:class:`RestartBudget`: backoff,
and it gives up past a bound), and on SIGTERM/SIGINT stops the workers, then the actors,
then the nats-server. Each worker writes its metrics to files in one private directory, so the
worker a scrape reaches answers with every worker's requests summed (``metrics_sum``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from bus import BusClosedError, open_bus
from gateway.ingress import metrics_sum
from gateway.process.config import redacted
from gateway.process.embedded_nats import EmbeddedNats
from gateway.process.port_claim import PortClaim, PortClaimedError, claim_port
from gateway.process.running_config import RunningConfig
from gateway.process.scratch import METRICS_PREFIX, make_scratch, sweep_dead_runs
from gateway.process.serve import (
    BusUnreachableError,
    ListenError,
    bind_socket,
    install_shutdown,
    run,
)
from gateway.process.worker import EXIT_BUS_LOST, WorkerSpec

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable

    from bus import Bus
    from gateway.process.serve import ServeOptions
    from schemas.config import GatewayConfig

logger = logging.getLogger("llmgw")

_READY_TIMEOUT_S = 60.0  # a worker answers /health within this or startup fails
_STOP_TIMEOUT_S = 15.0  # a worker drains within this after SIGTERM, else SIGKILL
_EXIT_WAIT_S = 5.0  # a worker that closed its stdout at startup has exited within this
FIRST = asyncio.FIRST_COMPLETED


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
        while True:
            proc = self._procs[slot]
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            delay = self._budgets[slot].next_delay()
            if delay is None:
                raise WorkersGaveUpError(
                    f"worker {slot + 1} keeps dying: {self._budgets[slot].intensity + 1} "
                    f"times within {self._budgets[slot].period:g}s (last: it {_ended(code)})"
                )
            logger.warning(
                "worker %d (pid %d) %s; restarting in %.1fs",
                slot + 1,
                proc.pid,
                _ended(code),
                delay,
            )
            await asyncio.sleep(delay)
            try:
                await self._start(slot, restart=True)
            except WorkerStartError as exc:
                logger.error("%s", exc)  # counted against the budget on its exit

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


async def run_workers(
    config: GatewayConfig,
    opts: ServeOptions,
    workers: int,
    *,
    loop: str = "uvloop",
    log_level: str = "INFO",
    on_ready: Callable[[str], None],
) -> int:
    """Serve with ``workers`` ingress processes until SIGINT/SIGTERM, the actor tree giving
    up or a worker's restart budget being spent. Returns the exit code. Raises ListenError
    (the port), EmbeddedNatsError and BusUnreachableError before anything serves."""
    shutdown = asyncio.Event()
    install_shutdown(shutdown)
    reserved, claim = _reserve(opts.host, opts.port)
    port = int(reserved.getsockname()[1])
    nats: EmbeddedNats | None = None
    ending: _Ending | None = None
    actors: asyncio.Task[int] | None = None
    actors_stop = asyncio.Event()
    pool: WorkerPool | None = None
    metrics: str | None = None
    follower: Bus | None = None
    following: asyncio.Task[None] | None = None
    try:
        sweep_dead_runs()
        if opts.bus_url.startswith("nats://"):
            bus_url = opts.bus_url
        else:
            nats = await EmbeddedNats.start()
            bus_url = nats.url
        ending = _Ending(shutdown, nats)
        running = RunningConfig(opts.config_path)  # read as the actors are about to
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def actors_ready(line: str) -> None:
            if not started.done():
                started.set_result(line)

        actors = asyncio.create_task(
            run(
                config,
                dataclasses.replace(
                    opts, bus_url=bus_url, role="actors", private_bus=nats is not None
                ),
                shutdown=actors_stop,
                on_ready=actors_ready,
                own_process=True,
                sighup=True,
            )
        )
        # Until every worker answers, SIGINT/SIGTERM or the private server's exit ends the
        # start (a start waiting for a bus that is down would otherwise never end).
        if not await ending.unless(asyncio.wait({actors, started}, return_when=FIRST)):
            return ending.code()
        if actors.done():
            return actors.result()
        try:
            follower = await open_bus(bus_url, inbox_prefix=config.bus.inbox_prefix)
        except BusClosedError as exc:
            raise BusUnreachableError(redacted(exc.message)) from None
        following = asyncio.create_task(running.follow(follower))
        spec = WorkerSpec(
            bus_url=bus_url,
            host=opts.host,
            port=port,
            config_path=opts.config_path,
            loop=loop,
            log_level=log_level,
            private_bus=nats is not None,
        )
        # Each worker's metrics go to files here; the one scraped sums them (metrics_sum).
        metrics = str(make_scratch(METRICS_PREFIX))
        pool = WorkerPool(spec, workers, {**os.environ, metrics_sum.ENV: metrics}, running=running)
        try:
            if not await ending.unless(pool.start()):
                return ending.code()
        except WorkerStartError as exc:
            logger.error("stopping: %s", exc)
            return 1
        on_ready(f"llmgw listening on http://{_url_host(opts.host)}:{port}")
        return await _until_done(ending, actors, asyncio.create_task(pool.watch()))
    finally:
        if ending is not None:
            ending.cancel()
        if pool is not None:
            await pool.aclose()
        if following is not None:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        if follower is not None:
            await follower.aclose()
        actors_stop.set()
        if actors is not None:
            with contextlib.suppress(Exception):
                await actors
        if nats is not None:
            await nats.aclose()
        if metrics is not None:
            shutil.rmtree(metrics, ignore_errors=True)
        reserved.close()
        claim.release()


class _Ending:
    """What ends a run from outside: SIGINT/SIGTERM (``shutdown``), or the private
    nats-server exiting. The server is this run's alone: gone, nothing brings it back, and
    the workers would answer 503s forever while every process retried it each second."""

    def __init__(self, shutdown: asyncio.Event, nats: EmbeddedNats | None) -> None:
        self._shutdown = shutdown
        self._nats = nats
        self.stop = asyncio.create_task(shutdown.wait())
        self.bus = asyncio.create_task(nats.wait() if nats is not None else _forever())

    async def unless(self, work: Awaitable[Any]) -> bool:
        """Await ``work`` unless the run ends first (``work`` is then cancelled): whether
        it finished. Raises what ``work`` raises."""
        task = asyncio.ensure_future(work)
        await asyncio.wait({task, self.stop, self.bus}, return_when=FIRST)
        if task.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False

    def code(self) -> int:
        """The run's exit code once it ended: 0 when asked to stop, 1 (and the reason
        logged) when its nats-server exited."""
        if self._shutdown.is_set() or not self.bus.done() or self._nats is None:
            return 0
        logger.error(
            "stopping: the embedded nats-server (pid %d) exited with code %s; the workers "
            "and the actors cannot reach each other without it",
            self._nats.pid,
            self.bus.result(),
        )
        return 1

    def cancel(self) -> None:
        """Stop watching."""
        self.stop.cancel()
        self.bus.cancel()


async def _forever() -> int:
    await asyncio.Event().wait()
    return 0


async def _until_done(ending: _Ending, actors: asyncio.Task[int], watch: asyncio.Task[None]) -> int:
    done, _ = await asyncio.wait({ending.stop, ending.bus, actors, watch}, return_when=FIRST)
    code = 0
    if watch in done:
        logger.error("stopping: %s", watch.exception())
        code = 1
    elif ending.stop in done or ending.bus in done:
        code = ending.code()
        if code == 0:
            logger.info(
                "stopping: the workers finish the requests they hold, then the actors and "
                "the bus stop"
            )
    elif actors in done:
        code = actors.result() or 1  # the tree ended before it was asked to
    watch.cancel()
    return code


def _reserve(host: str, port: int) -> tuple[socket.socket, PortClaim]:
    """The port, held (bound with SO_REUSEPORT, not listening) for the workers to share, and
    this run's claim on it (:mod:`gateway.process.port_claim`). Raises ListenError, also when
    another process serves the port or another ``--workers`` run has claimed it: SO_REUSEPORT
    would let a second run of this user join it, and the kernel then spread connections over
    two gateways (two configs, two sets of limits and circuits) with nothing said."""
    try:
        if port != 0:
            # Bound as one process serving alone binds (SO_REUSEADDR only): refused while
            # anything listens on the port, another run's workers included.
            bind_socket(host, port, listen=False).close()
        reserved = bind_socket(host, port, reuse_port=True, listen=False)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {_url_host(host)}:{port}: {exc.strerror or exc}"
        ) from None
    address, bound = reserved.getsockname()[:2]
    try:
        # Settles what the check above cannot: a run started at the same moment, whose
        # workers do not listen yet.
        return reserved, claim_port(address, bound)
    except (PortClaimedError, OSError) as exc:
        reserved.close()
        why = exc if isinstance(exc, PortClaimedError) else (exc.strerror or exc)
        raise ListenError(f"cannot listen on {_url_host(host)}:{bound}: {why}") from None


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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
