"""Running a gateway process: open the bus, start the actor tree, serve HTTP with Hypercorn.

Process wiring. The actors are hosted by ``gateway.process.actor_host``, imported only for the roles
that run them (``all``, ``actors``): an ``ingress`` process never loads the actors package.
``cli`` imports this module (lazily, for ``llmgw serve``); nothing here imports ``cli``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import re
import signal
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus import BusClosedError, open_bus
from gateway.admin.local_socket import LocalAdmin
from gateway.ingress.app import create_app
from gateway.process.config import load_config, redacted
from gateway.process.control import (
    config_version,
    install_sighup,
    load_versioned,
    report_ops,
    sighup_handler,
    start_ingress_ops,
    stop_ops,
)
from gateway.process.engines import serve_http, serve_local
from gateway.process.sidecars import Sidecars
from gateway.process.startup import lost_bus, until_started
from schemas import subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from gateway.process.actor_host import ActorHost
    from schemas.config import GatewayConfig

logger = logging.getLogger("llmgw")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``llmgw serve`` was asked to run."""

    host: str
    port: int
    bus_url: str
    role: str
    config_path: str | None = None  # re-read on reload (None: the bundled demo config)
    reuse_port: bool = False  # SO_REUSEPORT: one of several processes serving one port
    node_id: str | None = None  # an actors host's id in a cluster (None: one made up)
    # The bus is this run's own nats-server (--workers), its files gone with it: the events
    # stream is kept in its memory (a file store cost it tens of µs more per event).
    private_bus: bool = False
    # The version of the config text the app starts with, when not the file's now (a worker
    # given its supervisor's running text).
    config_version: str | None = None


NODE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
NODE_ID_RULE = "expected 1-128 letters, digits, '_', '.' or '-'"


def load_serving_config(path: str | None, role: str) -> GatewayConfig:
    """The config ``llmgw serve --role role`` runs. Where the actors run it is validated
    whole, routers and their params included (the strategies are theirs); an ingress checks
    the routers' shape only, and its actors process refuses a bad one. Raises ConfigError."""
    if role == "ingress":
        return load_config(path)
    from gateway.process.actor_host import load_checked_config

    return load_checked_config(path)


# Collect the young generation every 7,000 net allocations instead of 700: measured under
# the benchmark (concurrency 1 and 64), the collector's time fell from 5-10 % of the gateway's
# CPU to about 1 % (most per-request objects die by reference counting before a collection).
GC_THRESHOLDS = (7000, 20, 20)


def settle_gc() -> None:
    """Once started: everything built so far (modules, config, actors) lives as long as the
    process, so move it out of the collector's way (``gc.freeze``) and collect less often.
    A config swapped out by a reload stays frozen: a few objects per reload, by design."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def declare_asyncio() -> None:
    """Tell sniffio, which anyio asks on every cancel scope, event and sleep, that this task
    and every task it starts run asyncio, so it stops sniffing for the library each time (an
    import and a task lookup, three times per request). A context variable: it holds for the
    gateway's own tasks only, never for a caller's loop of another kind. Without sniffio,
    anyio asks asyncio directly and there is nothing to declare."""
    try:
        import sniffio
    except ImportError:  # pragma: no cover - anyio no longer requires it
        return
    sniffio.current_async_library_cvar.set("asyncio")


def announce(line: str) -> None:
    """Write the ready line on stdout (what scripts and the tests wait for)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _families(opts: ServeOptions, config: GatewayConfig) -> tuple[str, ...]:
    # The whole actor tree takes every observation (the steering actor's llmgw.obs.*): one
    # NATS subscription brings each once, not once more for its endpoint's actors (a
    # cluster host holds only its units' endpoints, so it keeps a subscription per subject).
    whole_tree = opts.role == "all" or (opts.role == "actors" and not config.cluster.enabled)
    return (subjects.OBSERVATION_ANY,) if whole_tree else ()


async def run(
    config: GatewayConfig,
    opts: ServeOptions,
    *,
    shutdown: asyncio.Event | None = None,
    on_ready: Callable[[str], None] = announce,
    own_process: bool = False,
    sighup: bool | None = None,
    bus_lost: asyncio.Event | None = None,
) -> int:
    """Run until ``shutdown`` is set (default: SIGINT/SIGTERM) or the actor tree gives up.

    ``on_ready`` gets the ready line once the gateway answers. With ``own_process`` (the
    CLI) the gateway owns the interpreter and tunes its collector (:func:`settle_gc`) before
    it announces itself. ``sighup`` (default: as for SIGINT/SIGTERM) reloads on SIGHUP.
    ``bus_lost``, once set, says the bus's server is gone for good: the bus is closed at
    once, so the requests still in flight and the stop wait on no reconnect.
    Returns the exit code (0 also when stopped before it answered). Raises ListenError (the
    port) and BusUnreachableError (the bus) before anything has started, BusLostError when
    the bus drops before it answers.
    """
    declare_asyncio()  # before any task starts: they inherit this context
    signals = shutdown is None
    hup = signals if sighup is None else sighup
    # Bind first: a taken port ends startup before anything else has started.
    sock = None if opts.role == "actors" else _listen(opts.host, opts.port, opts.reuse_port)
    if shutdown is None:
        shutdown = asyncio.Event()
        install_shutdown(shutdown)
    host: ActorHost | None = None
    ops: asyncio.Task[None] | None = None
    sidecars: Sidecars | None = None
    local: LocalAdmin | None = None
    try:
        bus = await open_bus(
            opts.bus_url, inbox_prefix=config.bus.inbox_prefix, families=_families(opts, config)
        )
    except BusClosedError as exc:
        if sock is not None:
            sock.close()
        raise BusUnreachableError(redacted(exc.message)) from None
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    closer = None if bus_lost is None else asyncio.create_task(_close_when(bus_lost, bus))
    ready = False
    try:
        if opts.role in ("all", "actors"):
            from gateway.process.actor_host import ActorHost

            # The probers listen before the actors start: a probe due at once is not lost.
            sidecars = Sidecars(bus, config)
            if opts.role == "actors" and config.cluster.enabled:
                host = await ActorHost.start_cluster(
                    bus, config, opts.node_id, sidecars.place, opts.config_path
                )
            else:
                host = await ActorHost.start(
                    bus, config, opts.config_path, events_in_memory=opts.private_bus
                )
            sidecars.actors_started()
            if hup:
                install_sighup(sighup_handler(bus))
            sidecars.follow(
                functools.partial(load_versioned, opts.config_path),
                config_version(opts.config_path),
            )
            logger.info(
                "actors started on %s (%d models)", redacted(opts.bus_url), len(config.models)
            )
        if opts.role == "actors":
            local = LocalAdmin.open(bus, config.database.path, None, serve_local)
            if own_process:
                settle_gc()
            ready = True
            on_ready(f"llmgw actors running on {redacted(opts.bus_url)}")
            return await _wait(shutdown, host)
        assert sock is not None
        port = sock.getsockname()[1]
        app = create_app(bus, config)
        ops = start_ingress_ops(bus, app, opts.config_path, opts.config_version)
        if host is not None:
            local = LocalAdmin.open(bus, config.database.path, app.ops.sync_config, serve_local)
        if hup and host is None:
            install_sighup(sighup_handler(bus))
        if config.admin_key is None:
            logger.info("no admin key configured: X-Route-Pin is disabled")
        server = asyncio.create_task(
            serve_http(config.server.engine, app, sock, config.server, shutdown)
        )
        if not await until_started(opts.host, port, server, ops, shutdown):
            return 0  # stopped (SIGINT/SIGTERM) before it answered
        ready = True
        report_ops(ops)
        if own_process:
            settle_gc()
        on_ready(f"llmgw listening on http://{_url_host(opts.host)}:{port}")
        code = await _wait(shutdown, host, server)
        await server
        return code
    except Exception as exc:
        # The bus dropped while this process started (a subscription's confirmation timed
        # out, the ingress operations could not subscribe): one line, not a traceback.
        why = None if ready else lost_bus(exc, bus)
        if why is None:
            raise
        raise BusLostError(f"lost the bus while starting: {redacted(why)}") from None
    finally:
        if sock is not None:
            sock.close()  # a no-op once Hypercorn owns it (detached)
        if local is not None:
            await local.aclose()
        if ops is not None:
            await stop_ops(ops)
        if sidecars is not None:
            await sidecars.aclose()
        if host is not None:
            await host.aclose()
        if closer is not None:
            closer.cancel()
        await bus.aclose()


async def _close_when(lost: asyncio.Event, bus: Bus) -> None:
    # Left open, a bus whose server is gone reconnects forever: its requests wait their
    # timeouts, and the request log's outbox its retries, for an answer that cannot come.
    await lost.wait()
    await bus.aclose()


class ListenError(Exception):
    """The HTTP port cannot be listened on; the message says which and why."""


class BusUnreachableError(Exception):
    """The bus cannot be joined at startup (no NATS server accepts); the message says where."""


class BusLostError(Exception):
    """The bus was joined but dropped before the process finished starting; the message says
    what failed on it."""


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The listening socket for ``host:port``. Raises ListenError."""
    try:
        return bind_socket(host, port, reuse_port=reuse_port)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {_url_host(host)}:{port}: {exc.strerror or exc}"
        ) from None


def install_shutdown(event: asyncio.Event) -> None:
    """SIGINT and SIGTERM set ``event``."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, event.set)


def bind_socket(
    host: str, port: int, *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: the kernel picks), so the real port is
    known upfront; listening unless ``listen`` is false. With ``reuse_port`` (SO_REUSEPORT)
    other sockets of this user may bind the same port and the kernel spreads connections
    over the listening ones."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(1024)
    sock.setblocking(False)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _wait(
    shutdown: asyncio.Event, host: ActorHost | None, server: asyncio.Task[None] | None = None
) -> int:
    waits: list[asyncio.Future[object]] = [asyncio.ensure_future(shutdown.wait())]
    if host is not None:
        waits.append(asyncio.ensure_future(host.wait()))
    if server is not None:
        waits.append(server)  # type: ignore[arg-type]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for task in done:
        if task is not waits[0] and task.exception() is not None:
            logger.error("stopping: %r", task.exception())
            code = 1
    shutdown.set()
    for task in pending:
        if task is not server:
            task.cancel()
    return code
