"""``llmgw serve --workers N``: the actors in this process, N ingress processes on one port.

Topology of one run (see the README): this supervisor process starts a private nats-server
(:mod:`gateway.process.embedded_nats`, unless ``--bus nats://`` names one), runs the actor
tree on it (role ``actors``: the local admin socket, SIGHUP reload, the request log), and
keeps N workers (:mod:`gateway.process.worker`, role ``ingress``) serving the HTTP port, each
on its own SO_REUSEPORT socket. It holds the port itself, bound but not listening, so the
port is known (``--port 0``) and stays reserved while a worker restarts. It prints the ready
line once every worker answers, restarts a worker that dies (``worker_pool``: backoff, and
it gives up past a bound), and on SIGTERM/SIGINT, also while it starts, stops the workers,
then the actors, then the nats-server. It claims its port for its whole life
(``port_claim``), so a second run started at the same moment cannot join it through
SO_REUSEPORT. Each worker writes its metrics to files in one private directory, so the worker
a scrape reaches answers with every worker's requests summed (``metrics_sum``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

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
from gateway.process.worker import WorkerSpec
from gateway.process.worker_pool import WorkerPool, WorkerStartError

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable

    from bus import Bus
    from gateway.process.serve import ServeOptions
    from schemas.config import GatewayConfig

logger = logging.getLogger("llmgw")

FIRST = asyncio.FIRST_COMPLETED
_FOLLOW_RETRY_S = 1.0


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
        following = asyncio.create_task(_follow_reloads(running, follower))
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


async def _follow_reloads(running: RunningConfig, bus: Bus) -> None:
    """Keep ``running`` following the actors' reloads until cancelled: a subscription the
    bus refused (it dropped as it was made) is made again, or every worker restarted later
    would be given the text of the run's start."""
    while True:
        try:
            await running.follow(bus)
        except BusClosedError as exc:
            logger.warning("config reloads not followed for restarted workers yet: %s", exc)
        await asyncio.sleep(_FOLLOW_RETRY_S)


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
        """The run's exit code once it ended: 0 when asked to stop, 1 when its nats-server
        exited; either said."""
        if self._shutdown.is_set() or not self.bus.done() or self._nats is None:
            logger.info("stopping: the workers finish the requests they hold, then the actors")
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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
