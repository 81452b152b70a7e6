"""``llmgw admin <area> <verb> [--json ARGS] [--arg K=V ...]``: one admin command.

Sent as ``AdminCommand`` on ``llmgw.admin.<area>.<verb>`` (``--bus``) or through an ingress's
``POST /admin/<area>/<verb>`` (``--url``); the owner's result is printed as JSON. Shortcuts:
``llmgw admin reload`` is ``config reload``, ``llmgw admin show`` is ``config show``.
Exit status: 0 done, 1 refused by the owner (its message on stderr), 2 not delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx

from bus import open_bus
from gateway.admin_http import admin_request
from gateway.cli_common import UsageError, add_target_args, admin_key, bus_url, fail
from schemas import GatewayError

_SHORTCUTS = {"reload": ("config", "reload"), "show": ("config", "show")}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``llmgw admin``."""
    p = sub.add_parser("admin", help="send an admin command to the gateway")
    p.add_argument("area", help="admin area (config, log, ...), or a shortcut: reload, show")
    p.add_argument("verb", nargs="?", help="the area's verb (reload, stats, query, ...)")
    p.add_argument("--json", dest="json_args", help="the verb's arguments as a JSON object")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="one argument (a JSON value, else a string); repeatable")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    add_target_args(p)
    p.set_defaults(func=run)


def command_args(args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """(area, verb, arguments) of the command line. Raises UsageError."""
    area, verb = args.area, args.verb
    if verb is None:
        if area not in _SHORTCUTS:
            raise UsageError(f"a verb is needed after {area!r} (shortcuts: "
                             f"{', '.join(sorted(_SHORTCUTS))})")
        area, verb = _SHORTCUTS[area]
    values: dict[str, Any] = {}
    if args.json_args:
        try:
            values = json.loads(args.json_args)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--json is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise UsageError("--json must be a JSON object")
    for item in args.arg:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--arg needs KEY=VALUE, got {item!r}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return area, verb, values


def run(args: argparse.Namespace) -> int:
    """Send the command; print its result."""
    try:
        area, verb, values = command_args(args)
        if args.url:
            result = _over_http(args.url, admin_key(args), area, verb, values, args.timeout)
        else:
            result = asyncio.run(_over_bus(bus_url(args), area, verb, values, args.timeout))
    except UsageError as exc:
        return fail("admin", str(exc))
    except _RefusedError as exc:
        return fail("admin", f"{area} {verb} refused: {exc}", 1)
    except (GatewayError, httpx.HTTPError, _NotDeliveredError) as exc:
        return fail("admin", f"{area} {verb} not delivered: {_message(exc)}")
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


class _RefusedError(Exception):
    """The owner (or the admin API) answered with an error."""


class _NotDeliveredError(Exception):
    """Nobody answered the command."""



def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, GatewayError) else f"{type(exc).__name__}: {exc}"


async def _over_bus(url: str, area: str, verb: str, values: dict[str, Any],
                    timeout: float) -> dict[str, Any]:
    bus = await open_bus(url, name="llmgw-admin")
    try:
        return await admin_request(bus, area, verb, values, by="cli", timeout=timeout)
    except GatewayError as err:
        if err.code.value in ("no_responders", "bus_timeout"):
            raise
        raise _RefusedError(err.message) from None
    finally:
        await bus.aclose()


def _over_http(url: str, key: str, area: str, verb: str, values: dict[str, Any],
               timeout: float) -> dict[str, Any]:
    resp = httpx.post(f"{url.rstrip('/')}/admin/{area}/{verb}", json=values, timeout=timeout,
                      headers={"authorization": f"Bearer {key}"})
    if resp.status_code != 200:
        try:
            error = resp.json()["error"]
            message, code = str(error["message"]), str(error.get("code", ""))
        except (ValueError, KeyError, TypeError):
            message, code = resp.text[:500], ""
        if code in ("no_responders", "bus_timeout"):
            raise _NotDeliveredError(message)
        raise _RefusedError(f"HTTP {resp.status_code}: {message}")
    result: dict[str, Any] = resp.json()
    return result
