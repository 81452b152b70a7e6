"""What the operator subcommands share: how they find the gateway, durations, errors.

A command reaches a running gateway (:func:`target`) through the HTTP admin API of one
ingress (``--url http://host:port`` with the admin key from ``--admin-key`` or
``$LLMGW_ADMIN_KEY``), over the bus (``--bus nats://...``, default ``$LLMGW_BUS``, else the
``bus.url`` of ``--config``), or else through the local socket beside the gateway's database
(``gateway.admin.local_socket``: the ``database.path`` of ``--config``, default ``llmgw.sqlite3``),
which needs no key. An ``inproc://`` bus exists only inside one process, so it cannot be
joined from outside.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from gateway.admin.local_socket import socket_path
from gateway.process.config import ConfigError, database_from_env, load_sections, redacted
from schemas import is_read_only_admin_verb
from schemas.config import GatewayConfig
from schemas.keys import parse_since as since_instant

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


class UsageError(Exception):
    """The command line cannot be acted on; the message says why."""


def parse_duration(text: str) -> float:
    """Seconds in ``30s``, ``10m``, ``2h``, ``1d`` or plain seconds. Raises UsageError."""
    m = _DURATION.match(text)
    if m is None:
        raise UsageError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 1d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_since(text: str) -> float:
    """Unix seconds from a ``--since``, read as every ``since`` is (the admin API's too): a
    duration ago with its unit (``30s``, ``10m``, ``2h``, ``1d``), unix seconds, or an ISO 8601
    time (UTC without an offset). Raises UsageError."""
    try:
        return since_instant(text, time.time())
    except ValueError as exc:
        raise UsageError(f"--since: {exc} (e.g. 10m, 2h, 2026-12-01T09:00)") from None


def add_target_args(p: argparse.ArgumentParser) -> None:
    """``--url`` / ``--admin-key``, ``--bus`` and ``--config``."""
    p.add_argument(
        "--url", help="an ingress, http://HOST:PORT (its admin API; needs the admin key)"
    )
    p.add_argument("--admin-key", help="admin key for --url (default $LLMGW_ADMIN_KEY)")
    p.add_argument(
        "--bus",
        help="the gateway's bus, nats://HOST:PORT (default $LLMGW_BUS, else bus.url of --config)",
    )
    p.add_argument(
        "--config",
        help="the gateway's config file: its bus.url, else the local "
        "socket beside its database.path (default llmgw.sqlite3)",
    )


def settings(args: argparse.Namespace) -> GatewayConfig:
    """The ``bus`` and ``database`` sections of ``--config`` (defaults without one), read
    without the rest of the file (``LLMGW_DATABASE_URL`` wins). Raises UsageError."""
    try:
        if not getattr(args, "config", None):
            return database_from_env(GatewayConfig(), "<defaults>")
        return load_sections(args.config, "bus", "database")
    except ConfigError as exc:
        raise UsageError(f"invalid configuration: {exc}") from None


@dataclass(frozen=True, slots=True)
class Target:
    """How to reach the gateway: ``bus`` (a NATS URL), or its HTTP admin API at ``url`` with
    ``key``, or at the local ``socket`` (no key)."""

    bus: str = ""
    url: str = ""
    key: str = ""
    socket: str = ""


def target(args: argparse.Namespace) -> Target:
    """``--url``, else the bus (``--bus``, ``$LLMGW_BUS``, the config's NATS), else the local
    socket of the config's database. Raises UsageError when none of them is there."""
    if args.url:
        return Target(url=args.url, key=admin_key(args))
    config = settings(args)
    bus = args.bus or os.environ.get("LLMGW_BUS") or config.bus.url
    if not bus.startswith("inproc://"):
        return Target(bus=bus_url(args))
    return Target(socket=str(local_socket(config.database.path)))


def local_socket(database: str) -> Path:
    """The local socket of the gateway using ``database``. Raises UsageError when no gateway
    listens there."""
    path = socket_path(database)
    if not path.exists():
        raise UsageError(
            f"no gateway is serving {database} here (no socket {path}): start "
            "`llmgw serve` in that directory, or name its config (--config), "
            "its bus (--bus nats://...) or an ingress (--url http://...)"
        )
    return path


class LogFileError(Exception):
    """The request log's file cannot be read; the message says why."""


class RefusedError(Exception):
    """The owner (or the admin API) answered with an error."""


class NotDeliveredError(Exception):
    """Nobody answered the command. ``code`` is the gateway's error code when one answered for
    the owner (``no_responders``, ``bus_timeout``: then the owner may have applied it)."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class OwnerUnreachableError(Exception):
    """A gateway runs (it answered) but the command did not reach the owner, or its outcome is
    unknown: the file is that owner's and is never written by the CLI."""


_OWNER = {"api_keys": "keys owner", "limits": "limits owner"}
# What shows an area's state: where to check whether a change that timed out was applied.
_CHECK = {
    "api_keys": "`llmgw keys list`",
    "chains": "`llmgw admin chains list`",
    "config": "`llmgw admin show`",
    "limits": "`llmgw admin limits get`",
    "provider_keys": "`llmgw admin provider_keys list`",
    "routewise": "`llmgw admin routewise settings`",
    "routing": "`llmgw admin routing weights`",
    "rules": "`llmgw admin rules get`",
    "steering": "`llmgw admin steering get`",
}


def not_reached(
    where: str, area: str, verb: str, reason: str, *, timed_out: bool
) -> OwnerUnreachableError:
    """The one line for a command ``where`` (the gateway on …) could not deliver (``reason``,
    the gateway's own words; never a key): retry, or for a change that timed out, check."""
    owner = _OWNER.get(area, f"{area} owner")
    said = redacted(reason).rstrip(".")
    if not timed_out:
        return OwnerUnreachableError(
            f"the gateway on {where} is running but could not reach its {owner} ({said}); "
            "nothing was written: retry in a moment"
        )
    # A verb that changes nothing is sent again as it is; any other may have been applied.
    if is_read_only_admin_verb(area, verb):
        return OwnerUnreachableError(
            f"the gateway on {where} is running but its {owner} did not answer in time "
            f"({said}): retry in a moment"
        )
    check = f"with {_CHECK[area]}" if area in _CHECK else "its state"
    return OwnerUnreachableError(
        f"the gateway on {where} is running but its {owner} did not answer in time "
        f"({said}): the outcome of {verb} is unknown; check {check} before retrying"
    )


def http_client(where: Target, timeout: float | None) -> httpx.Client:
    """An HTTP client for ``where``'s admin API (``url`` with its key, or the socket)."""
    if where.socket:
        return httpx.Client(
            base_url="http://llmgw",
            timeout=timeout,
            transport=httpx.HTTPTransport(uds=where.socket),
        )
    return httpx.Client(
        base_url=where.url.rstrip("/"),
        timeout=timeout,
        headers={"authorization": f"Bearer {where.key}"},
    )


def admin_over_http(
    where: Target, area: str, verb: str, values: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """``POST /admin/<area>/<verb>``; the owner's result.

    Raises RefusedError, NotDeliveredError (nobody owns it, or no answer), httpx.HTTPError.
    """
    with http_client(where, timeout) as client:
        resp = client.post(f"/admin/{area}/{verb}", json=values)
    if resp.status_code != 200:
        try:
            error = resp.json()["error"]
            message, code = str(error["message"]), str(error.get("code", ""))
        except (ValueError, KeyError, TypeError):
            # No owner's answer: the status is all there is to say (a proxy's page, say).
            message, code = f"HTTP {resp.status_code}: {resp.text[:500]}", ""
        if code in ("no_responders", "bus_timeout"):
            raise NotDeliveredError(message, code=code)
        # The owner's own words, as over the bus: "refused: HTTP 400: ..." through the local
        # socket, which the operator never asked over HTTP, said the same thing otherwise.
        raise RefusedError(message)
    result: dict[str, Any] = resp.json()
    return result


def bus_url(args: argparse.Namespace) -> str:
    """The NATS URL to join. Raises UsageError when there is none to join."""
    url = args.bus or os.environ.get("LLMGW_BUS") or settings(args).bus.url
    if url.startswith("inproc://"):
        hint = " or --url http://HOST:PORT" if hasattr(args, "url") else ""
        raise UsageError(
            "need a shared bus to reach the gateway: --bus nats://HOST:PORT"
            f"{hint} (an inproc:// bus lives inside one process)"
        )
    if not url.startswith("nats://"):
        raise UsageError(
            f"not a bus to join: {redacted(url)!r} (the gateway's bus is nats://HOST:PORT)"
        )
    return str(url)


def admin_key(args: argparse.Namespace) -> str:
    """The admin key for ``--url``. Raises UsageError when there is none."""
    key = args.admin_key or os.environ.get("LLMGW_ADMIN_KEY")
    if not key:
        raise UsageError("--url needs the admin key: --admin-key or $LLMGW_ADMIN_KEY")
    return str(key)


def fail(command: str, message: str, code: int = 2) -> int:
    """Report ``message`` (any URL password masked) on stderr; return ``code``."""
    sys.stderr.write(f"llmgw {command}: {redacted(message)}\n")
    return code
