"""``llmgw admin <area> <verb> [--json ARGS | --file ARGS.json] [--arg K=V ...]``: one admin
command.

Sent as ``AdminCommand`` on ``llmgw.admin.<area>.<verb>`` (``--bus``) or as
``POST /admin/<area>/<verb>`` to an ingress (``--url``) or to the local socket of a gateway on
this machine (neither given; see ``gateway.cli.common``); the owner's result is printed as
JSON. ``spend report`` with neither, and no gateway answering here, is read from the request
log's database itself (``gateway.cli.logs_offline``: the config's ``database.url``, else its
file). Shortcuts:
``llmgw admin reload`` is ``config reload``, ``llmgw admin show`` is ``config show``.
Exit status: 0 done, 1 refused by the owner (its message on stderr), 2 not delivered, or
not answered in time (a change then says its outcome is unknown: check before sending it again).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bus import open_bus
from gateway.admin.http import admin_request
from gateway.admin.local_socket import answers, socket_path
from gateway.cli.common import (
    LogFileError,
    NotDeliveredError,
    RefusedError,
    Target,
    UsageError,
    add_target_args,
    admin_over_http,
    fail,
    not_reached,
    settings,
    target,
)
from gateway.process.config import redacted
from schemas import GatewayError, InvalidRequestError

if TYPE_CHECKING:
    import argparse

    from schemas.config import DatabaseConfig

_SHORTCUTS = {"reload": ("config", "reload"), "show": ("config", "show")}
_ANSWER_TIMEOUT_S = 30.0  # an owner may wait for others (a reload, pools applying keys)
# A bus that accepts no connection for this long is reported (one line) rather than waited
# on in silence; an explicit --timeout keeps trying that long (a NATS being restarted).
_CONNECT_TIMEOUT_S = 5.0
_MAX_TIMEOUT_S = 86_400.0  # a day; past what a socket's timeout holds, nothing is waited on


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``llmgw admin``."""
    p = sub.add_parser("admin", help="send an admin command to the gateway")
    p.add_argument("area", help="admin area (config, log, ...), or a shortcut: reload, show")
    p.add_argument("verb", nargs="?", help="the area's verb (reload, stats, query, ...)")
    p.add_argument("--json", dest="json_args", help="the verb's arguments as a JSON object")
    p.add_argument(
        "--file",
        dest="json_file",
        metavar="PATH",
        help="the verb's arguments as a JSON object in a file (rules put --file rules.json)",
    )
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one argument (a JSON value, else a string); repeatable",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help=f"seconds to wait for the answer (default {_ANSWER_TIMEOUT_S:g}) and, when given, "
        f"to keep trying to reach the bus (default {_CONNECT_TIMEOUT_S:g})",
    )
    add_target_args(p)
    p.set_defaults(func=run)


def command_args(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """(area, verb, arguments) of the command line. Raises UsageError."""
    area, verb = args.area, args.verb
    if verb is None:
        if area not in _SHORTCUTS:
            raise UsageError(
                f"a verb is needed after {area!r} (shortcuts: {', '.join(sorted(_SHORTCUTS))})"
            )
        area, verb = _SHORTCUTS[area]
    values: dict[str, Any] = {}
    if args.json_args:
        values = _json_object(args.json_args, "--json")
    elif args.json_file:
        try:
            with open(args.json_file, encoding="utf-8") as f:
                values = _json_object(f.read(), f"--file {args.json_file}")
        except OSError as exc:
            raise UsageError(f"--file: {exc.strerror}: {args.json_file}") from None
    for item in args.arg:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--arg needs KEY=VALUE, got {item!r}")
        try:
            values[key] = _loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
        except ValueError as exc:  # a number JSON cannot carry
            raise UsageError(f"--arg {key}: {exc}") from None
    return area, verb, values


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large a number")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is no JSON number")


def _loads(text: str) -> Any:
    """JSON as the gateway's decoder reads it: no NaN or Infinity, no float past the largest
    (Python's own json takes them, and the request then fails with a message naming none)."""
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        values = _loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
    except RecursionError:
        raise UsageError(f"{what} is JSON nested too deeply") from None
    if not isinstance(values, dict):
        raise UsageError(f"{what} must be a JSON object")
    return values


def run(args: argparse.Namespace) -> int:
    """Send the command; print its result."""
    where = Target()
    try:
        area, verb, values = command_args(args)
        offline = _offline_database(args) if (area, verb) == ("spend", "report") else None
        if offline is not None:
            # Imported here only: the offline reader needs the actors' package.
            from gateway.cli.logs_offline import spend_report

            try:
                report = spend_report(offline, values)
            except InvalidRequestError as exc:  # as the owner would refuse it, not "not delivered"
                raise RefusedError(exc.message) from None
            sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
            return 0
        if args.timeout is not None and not 0 < args.timeout < _MAX_TIMEOUT_S:
            # 0 sent the command and gave up on its answer at once, said "not delivered".
            raise UsageError(
                f"--timeout: seconds above 0 and under {_MAX_TIMEOUT_S:g}, not {args.timeout:g}"
            )
        where = target(args)
        timeout = _ANSWER_TIMEOUT_S if args.timeout is None else args.timeout
        if where.bus:
            connect = _CONNECT_TIMEOUT_S if args.timeout is None else args.timeout
            result = asyncio.run(_over_bus(where.bus, area, verb, values, timeout, connect))
        else:
            result = admin_over_http(where, area, verb, values, timeout)
    except (UsageError, ValueError) as exc:
        return fail("admin", str(exc))
    except LogFileError as exc:
        return fail("admin", f"cannot read the request log: {exc}", 1)
    except RefusedError as exc:
        return fail("admin", f"{area} {verb} refused: {exc}", 1)
    except (GatewayError, httpx.HTTPError, NotDeliveredError) as exc:
        if _timed_out(exc):  # sent, and the owner may have applied it: not "not delivered"
            line = not_reached(_place(where), area, verb, _message(exc), timed_out=True)
            return fail("admin", str(line))
        return fail("admin", f"{area} {verb} not delivered: {_message(exc)}")
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


def _offline_database(args: argparse.Namespace) -> DatabaseConfig | None:
    """The database to read a report from when no gateway can be asked (no ``--url``, no
    NATS bus, no gateway answering on the local socket); None to ask the gateway."""
    if args.url or args.bus or os.environ.get("LLMGW_BUS"):
        return None
    config = settings(args)
    if not config.bus.url.startswith("inproc://") or answers(socket_path(config.database.path)):
        return None
    if config.database.url or Path(config.database.path).exists():
        return config.database
    return None


def _timed_out(exc: Exception) -> bool:
    """Whether ``exc`` says the command was sent but not answered in time: the gateway's
    ``bus_timeout``, or no answer from the ingress or the socket within ``--timeout``."""
    if isinstance(exc, GatewayError):
        return exc.code.value == "bus_timeout"
    if isinstance(exc, NotDeliveredError):
        return exc.code == "bus_timeout"
    # Sent, then no answer: the gateway may have run it before the connection closed.
    return isinstance(exc, httpx.ReadTimeout | httpx.ReadError | httpx.RemoteProtocolError)


def _place(where: Target) -> str:
    """Where the gateway answering the command is: its bus, ingress or local socket."""
    return redacted(where.bus or where.url) or where.socket


def _message(exc: Exception) -> str:
    if isinstance(exc, GatewayError):
        return exc.message
    if isinstance(exc, httpx.ReadTimeout):
        return "no answer within the --timeout"
    if isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError):
        return "the connection closed before the answer"
    return str(exc) if isinstance(exc, NotDeliveredError) else f"{type(exc).__name__}: {exc}"


async def _over_bus(
    url: str, area: str, verb: str, values: dict[str, Any], timeout: float, connect: float
) -> dict[str, Any]:
    bus = await open_bus(url, name="llmgw-admin", connect_timeout=connect)
    try:
        return await admin_request(bus, area, verb, values, by="cli", timeout=timeout)
    except GatewayError as err:
        if err.code.value in ("no_responders", "bus_timeout"):
            raise
        raise RefusedError(err.message) from None
    finally:
        await bus.aclose()
