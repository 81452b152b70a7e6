"""One ingress worker of ``llmgw serve --workers N``: ``python -m gateway.process.worker``.

Started only by :mod:`gateway.process.workers`, which writes one JSON line to its stdin
(:class:`WorkerSpec`: the bus URL with this run's NATS credential, so it never appears on a
command line, and where to listen) and keeps the pipe open. The worker serves the ingress
role on the shared port (SO_REUSEPORT), writes ``ready <pid>`` on stdout once it answers, and
stops on SIGTERM/SIGINT or when its stdin ends (the supervisor is gone, even by SIGKILL).

Why the pipe tells a worker its supervisor died: its write end is held by the supervisor
alone (pipes are close-on-exec, children started with ``close_fds``), so the kernel ends it
the moment that process dies, however it dies, on every POSIX system, and the event loop sees
it at once. ``prctl(PR_SET_PDEATHSIG)`` is Linux-only and fires when the *thread* that forked
the worker ends, not the process; polling ``os.getppid()`` notices only at its next tick.
An orphaned worker drains as on SIGTERM. Its supervisor's private nats-server (the default)
died with it, so the worker closes the bus at once rather than reconnect to nothing: requests
in flight finish without it, and the request-log rows no store can acknowledge any more are
logged as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

import msgspec

from gateway.process.config import ConfigError, parse_config
from gateway.process.running_config import text_version

logger = logging.getLogger("llmgw")

_BUS_RETRY_S = 1.0  # between a restarted worker's tries to reach the bus
# The exit code of a worker whose bus dropped while it started: not a crash of its own; the
# supervisor starts another, which waits for the bus to come back.
EXIT_BUS_LOST = 3

if TYPE_CHECKING:
    from gateway.process.serve import ServeOptions
    from schemas.config import GatewayConfig


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the supervisor tells a worker (one JSON line on its stdin)."""

    bus_url: str
    host: str
    port: int
    config_path: str | None
    loop: str = "uvloop"
    log_level: str = "INFO"
    private_bus: bool = False  # the supervisor's own nats-server: it dies with the supervisor
    # The config text the gateway runs (the file's at start or at the last reload applied),
    # served rather than the file as it is now; None: the file (the bundled demo config).
    config_text: str | None = None
    # A restart: a bus it cannot reach is waited for, as the running processes wait for it to
    # come back, not an exit the supervisor's restart budget would count as a crash.
    wait_for_bus: bool = False
    slot: int = 0  # which worker (1..N) this process is, named in each line it logs


def main() -> int:
    """Read the spec from stdin and serve until told to stop; returns the exit code."""
    from gateway.process.engines import run_loop
    from gateway.process.serve import (
        BusLostError,
        BusUnreachableError,
        ListenError,
        ServeOptions,
        load_serving_config,
    )

    # A SIGHUP sent to every llmgw process (pkill -HUP, a terminal's hangup) must not end a
    # worker and the streams it holds, as its default action would: the supervisor's own
    # reload reaches every worker, which serves what the actors run, never its own reading.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = msgspec.json.decode(sys.stdin.buffer.readline(), type=WorkerSpec)
    # Every process of the run logs to the supervisor's stderr: each line says which worker.
    logging.basicConfig(
        level=spec.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker {spec.slot} (pid {os.getpid()}) "
        "%(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if spec.config_text is None:
            config = load_serving_config(spec.config_path, "ingress")
        else:
            config = parse_config(spec.config_text, source=str(spec.config_path))
    except ConfigError as exc:
        logger.error("stopping: invalid configuration: %s", exc)
        return 2
    opts = ServeOptions(
        host=spec.host,
        port=spec.port,
        bus_url=spec.bus_url,
        role="ingress",
        config_path=spec.config_path,
        reuse_port=True,
        private_bus=spec.private_bus,
        config_version=None if spec.config_text is None else text_version(spec.config_text),
    )
    try:
        return run_loop(_serve(config, opts, spec.wait_for_bus), spec.loop)
    except ListenError as exc:
        logger.error("stopping: %s", exc)
        return 2
    except (BusLostError, BusUnreachableError) as exc:
        # Its supervisor has joined this bus: one this worker cannot join, or that dropped
        # while it started, is lost for now. The supervisor starts another, which waits.
        logger.error("stopping: %s", exc)
        return EXIT_BUS_LOST


async def _serve(config: GatewayConfig, opts: ServeOptions, wait_for_bus: bool) -> int:
    from gateway.process.serve import BusUnreachableError, install_shutdown, run

    shutdown = asyncio.Event()
    install_shutdown(shutdown)
    orphaned = asyncio.Event()
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)

    def on_stdin() -> None:
        # EOF: the supervisor closed the pipe or died; stop rather than serve orphaned.
        try:
            ended = not os.read(stdin, 4096)
        except BlockingIOError:
            return
        if not ended:
            return
        loop.remove_reader(stdin)
        if not shutdown.is_set():  # not when the supervisor stops us: it sends SIGTERM first
            logger.warning(
                "the supervisor is gone: finishing the requests in flight, then stopping%s",
                " (its nats-server went with it: the bus is closed now)"
                if opts.private_bus
                else "",
            )
        orphaned.set()
        shutdown.set()

    loop.add_reader(stdin, on_stdin)
    told = False
    try:
        while True:
            try:
                return await run(
                    config,
                    opts,
                    shutdown=shutdown,
                    on_ready=_ready,
                    own_process=True,
                    sighup=False,  # the supervisor reloads through the actors
                    bus_lost=orphaned if opts.private_bus else None,
                )
            except BusUnreachableError as exc:
                if not wait_for_bus:
                    raise
                if not told:
                    logger.warning("waiting for the bus to come back: %s", exc)
                    told = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shutdown.wait(), _BUS_RETRY_S)
            if shutdown.is_set():
                return 0
    finally:
        loop.remove_reader(stdin)


def _ready(_line: str) -> None:
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
