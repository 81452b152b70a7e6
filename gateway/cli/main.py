"""``llmgw``: the command-line entry point.

Each subcommand lives in its own module exposing ``register(subparsers)`` (adds its parser
and sets ``func``) so commands stay independent: ``serve`` here; others are listed in
``_COMMAND_MODULES``. ``func(args) -> int`` returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING

from gateway.process.config import ConfigError, redacted

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger("llmgw")
_MAX_PORT = 65535

# Modules with register(subparsers); each adds one or more subcommands.
_COMMAND_MODULES: tuple[str, ...] = (
    "gateway.cli.admin",
    "gateway.cli.events",
    "gateway.cli.keys",
    "gateway.cli.logs",
    "gateway.cli.replay",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw", description="LLM routing gateway")
    p.add_argument(
        "--log-level",
        help="DEBUG, INFO, WARNING, ERROR (default: INFO for serve, "
        "WARNING for the operator commands)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config file (default: the bundled demo config)")
    serve.add_argument("--host", help="listen address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port; 0 picks a free one (default 8080)")
    serve.add_argument("--bus", help="inproc:// (default) or nats://HOST:PORT")
    serve.add_argument("--role", choices=("all", "ingress", "actors"), default="all")
    serve.add_argument(
        "--node-id",
        help="this actors host's id in a cluster (cluster.enabled; default: "
        "hostname-pid-random, unique per process)",
    )
    serve.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop (default uvloop)",
    )
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="ingress processes sharing the port, beside one process running the actors on a "
        "private NATS server; auto: one per core this process may use, its CPU quota counted "
        "(default 1: everything in one process)",
    )
    serve.set_defaults(func=_serve)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the command; returns the process exit code."""
    args = _parser().parse_args(argv)
    _configure_logging(args)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`llmgw logs | head`): stop quietly, and keep the interpreter's
        # final flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _configure_logging(args: argparse.Namespace) -> None:
    serving = args.command == "serve"
    logging.basicConfig(
        level=(args.log_level or ("INFO" if serving else "WARNING")).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not serving and args.log_level is None:
        # An operator command reports a bus it cannot reach in its own one line; the bus's
        # reconnect warnings would only repeat it.
        logging.getLogger("bus").setLevel(logging.ERROR)


def _serve(args: argparse.Namespace) -> int:
    from gateway.process.embedded_nats import EmbeddedNatsError
    from gateway.process.engines import EngineUnavailableError, check_engine, run_loop
    from gateway.process.serve import (
        NODE_ID,
        NODE_ID_RULE,
        BusLostError,
        BusUnreachableError,
        ListenError,
        ServeOptions,
        announce,
        load_serving_config,
        run,
    )

    try:
        config = load_serving_config(args.config, args.role)
    except ConfigError as exc:
        sys.stderr.write(f"llmgw: invalid configuration: {exc}\n")
        return 2

    opts = ServeOptions(
        host=args.host or config.server.host,
        port=config.server.port if args.port is None else args.port,
        bus_url=args.bus or config.bus.url,
        role=args.role,
        config_path=args.config,
        node_id=args.node_id,
    )
    if not 0 <= opts.port <= _MAX_PORT:
        sys.stderr.write(f"llmgw: --port {opts.port}: a port is 0-{_MAX_PORT} (0: any free one)\n")
        return 2
    if not opts.bus_url.startswith(("inproc://", "nats://")):
        shown = redacted(opts.bus_url)
        sys.stderr.write(f"llmgw: --bus {shown!r}: a bus is inproc:// or nats://HOST:PORT\n")
        return 2
    if opts.role != "all" and opts.bus_url.startswith("inproc://"):
        sys.stderr.write("llmgw: --role ingress/actors needs a shared bus (--bus nats://...)\n")
        return 2
    if args.node_id is not None and not NODE_ID.fullmatch(args.node_id):
        sys.stderr.write(f"llmgw: --node-id {args.node_id!r}: {NODE_ID_RULE}\n")
        return 2
    if args.workers > 1 and opts.role != "all":
        sys.stderr.write("llmgw: --workers runs every role itself; drop --role\n")
        return 2
    try:
        check_engine(config.server.engine)
        if args.workers > 1:
            from gateway.process.workers import run_workers

            main = run_workers(
                config,
                opts,
                args.workers,
                loop=args.loop,
                log_level=logging.getLevelName(logging.getLogger().level),
                on_ready=announce,
            )
            return run_loop(main, args.loop)
        return run_loop(run(config, opts, own_process=True), args.loop)
    except (
        ListenError,
        BusUnreachableError,
        BusLostError,
        EngineUnavailableError,
        EmbeddedNatsError,
    ) as exc:
        sys.stderr.write(f"llmgw: {exc}\n")
        return 2
    except ConfigError as exc:  # refused once the bus showed more (a second actors host)
        sys.stderr.write(f"llmgw: invalid configuration: {exc}\n")
        return 2


def _workers(value: str) -> int:
    """``--workers``: a count of at least 1, or ``auto`` (the cores this process may use:
    its affinity, capped by its cgroup's CPU quota)."""
    if value == "auto":
        from gateway.process.cores import usable_cores

        return usable_cores()
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a count of at least 1, or auto")
    return count


if __name__ == "__main__":
    sys.exit(main())
