"""One ingress worker of ``llmgw serve --workers N``: ``python -m gateway.process.worker``.

Started only by :mod:`gateway.process.workers`, which writes one JSON line to its stdin
(:class:`WorkerSpec`: the bus URL with this run's NATS credential, so it never appears on a
command line, and where to listen) and keeps the pipe open. The worker serves the ingress
role on the shared port (SO_REUSEPORT), writes ``ready <pid>`` on stdout once it answers, and
stops on SIGTERM/SIGINT or when its stdin ends (the supervisor is gone, even by SIGKILL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING

import msgspec

from gateway.process.config import ConfigError

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


def main() -> int:
    """Read the spec from stdin and serve until told to stop; returns the exit code."""
    from gateway.process.engines import run_loop
    from gateway.process.serve import (
        BusUnreachableError,
        ListenError,
        ServeOptions,
        load_serving_config,
    )

    spec = msgspec.json.decode(sys.stdin.buffer.readline(), type=WorkerSpec)
    logging.basicConfig(
        level=spec.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_serving_config(spec.config_path, "ingress")
    except ConfigError as exc:
        sys.stderr.write(f"llmgw worker: invalid configuration: {exc}\n")
        return 2
    opts = ServeOptions(
        host=spec.host,
        port=spec.port,
        bus_url=spec.bus_url,
        role="ingress",
        config_path=spec.config_path,
        reuse_port=True,
    )
    try:
        return run_loop(_serve(config, opts), spec.loop)
    except (ListenError, BusUnreachableError) as exc:
        sys.stderr.write(f"llmgw worker: {exc}\n")
        return 2


async def _serve(config: GatewayConfig, opts: ServeOptions) -> int:
    from gateway.process.serve import install_shutdown, run

    shutdown = asyncio.Event()
    install_shutdown(shutdown)
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)

    def on_stdin() -> None:
        # EOF: the supervisor closed the pipe or died; stop rather than serve orphaned.
        try:
            ended = not os.read(stdin, 4096)
        except BlockingIOError:
            return
        if ended:
            loop.remove_reader(stdin)
            shutdown.set()

    loop.add_reader(stdin, on_stdin)
    try:
        return await run(
            config,
            opts,
            shutdown=shutdown,
            on_ready=_ready,
            own_process=True,
            sighup=False,  # the supervisor reloads through the actors; every worker follows
        )
    finally:
        loop.remove_reader(stdin)


def _ready(_line: str) -> None:
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
