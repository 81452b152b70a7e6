"""What the operator subcommands share: how they find the gateway, durations, errors.

A command reaches a running gateway either over the bus (``--bus nats://...``, default
``$LLMGW_BUS``, else the ``bus.url`` of ``--config``) or through the HTTP admin API of one
ingress (``--url http://host:port`` with the admin key from ``--admin-key`` or
``$LLMGW_ADMIN_KEY``). An ``inproc://`` bus exists only inside one process, so it cannot be
joined from outside.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from gateway.config import ConfigError, load_config

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


def add_target_args(p: argparse.ArgumentParser, *, http: bool = True) -> None:
    """``--bus``, ``--config`` and, with ``http``, ``--url`` / ``--admin-key``."""
    p.add_argument("--bus", help="the gateway's bus, nats://HOST:PORT (default $LLMGW_BUS, "
                                 "else bus.url of --config)")
    p.add_argument("--config", help="a config file to take bus.url (and database.path) from")
    if http:
        p.add_argument("--url", help="instead of the bus: an ingress, http://HOST:PORT "
                                     "(its admin API)")
        p.add_argument("--admin-key", help="admin key for --url (default $LLMGW_ADMIN_KEY)")


def bus_url(args: argparse.Namespace) -> str:
    """The NATS URL to join. Raises UsageError when there is none to join."""
    url = args.bus or os.environ.get("LLMGW_BUS")
    if not url and args.config:
        try:
            url = load_config(args.config).bus.url
        except ConfigError as exc:
            raise UsageError(f"invalid configuration: {exc}") from None
    if not url or url.startswith("inproc://"):
        hint = " or --url http://HOST:PORT" if hasattr(args, "url") else ""
        raise UsageError("need a shared bus to reach the gateway: --bus nats://HOST:PORT"
                         f"{hint} (an inproc:// bus lives inside one process)")
    return str(url)


def redacted(url: str) -> str:
    """``url`` without the password of its credentials (``nats://user:***@host``)."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)


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
