"""``llmgw keys create|list|revoke``: gateway API keys, against the server's own database.

The database is the config's ``database.path`` (``--config``), or ``--db PATH``. Works while
the server runs (WAL). When the config names a NATS bus, a revocation (or the first key) is
also announced there so every ingress drops its cached copy at once; otherwise it applies
within ``auth_cache_seconds``. The key is printed once, at creation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from actors.apikeys import API_KEYS, ApiKeyStore, parse_duration, parse_instant
from actors.keystore import LazyDb
from gateway.cli_common import redacted
from gateway.config import ConfigError, load_sections
from schemas import ApiKeyCreated, ApiKeyRevoked, Message, subjects
from schemas.keys import ROLES

logger = logging.getLogger(__name__)

_ANNOUNCE_TIMEOUT = 3.0
_LIST_ROW = "{:16}  {:14}  {:24}  {:8}  {}"


def register(sub: Any) -> None:
    """Add ``keys`` and its subcommands to the ``llmgw`` parser."""
    keys = sub.add_parser("keys", help="manage gateway API keys")
    verbs = keys.add_subparsers(dest="keys_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML config file whose database.path to use")
        p.add_argument("--db", help="the SQLite file (overrides --config)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    create = verbs.add_parser("create", help="create a key (printed once)")
    common(create)
    create.add_argument("--org", required=True)
    create.add_argument("--user", required=True)
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", default="")
    create.add_argument("--expires-in", help="e.g. 3600, 90m, 12h, 30d")
    create.add_argument("--expires-at", help="ISO 8601 time (UTC unless it has an offset)")
    create.set_defaults(func=_run(_create))
    listing = verbs.add_parser("list", help="list keys (never the keys themselves)")
    common(listing)
    listing.set_defaults(func=_run(_list))
    revoke = verbs.add_parser("revoke", help="revoke a key by id (or by the key itself)")
    common(revoke)
    revoke.add_argument("key_id")
    revoke.set_defaults(func=_run(_revoke))


def _run(fn: Any) -> Any:
    def func(args: argparse.Namespace) -> int:
        try:
            return int(asyncio.run(fn(args)))
        except (ConfigError, ValueError) as exc:
            sys.stderr.write(f"llmgw keys: {exc}\n")
            return 2
    return func


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """(database path, bus url to announce on or "")."""
    # Only the sections needed: the models' ${VAR}s need not be set to manage keys.
    config = load_sections(args.config, "database", "bus") if args.config or not args.db \
        else None
    path = args.db or (config.database.path if config else "")
    bus = config.bus.url if config is not None and config.bus.url.startswith("nats://") else ""
    return path, bus


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    sys.stdout.write((json.dumps(data) if args.json else text) + "\n")


async def _announce(bus_url: str, msg: Message) -> None:
    if not bus_url:
        return
    from bus import open_bus

    try:
        async with asyncio.timeout(_ANNOUNCE_TIMEOUT):
            bus = await open_bus(bus_url, name="llmgw-keys-cli")
            try:
                await bus.publish(subjects.AUTH_KEYS_CHANGED, msg)
            finally:
                await bus.aclose()
    except Exception as exc:  # the database change stands; the caches expire on their own
        logger.warning("could not announce on %s (%s); ingresses apply it within their "
                       "auth_cache_seconds", redacted(bus_url), exc)


async def _create(args: argparse.Namespace) -> int:
    path, bus = _target(args)
    now = time.time()
    expires = _expiry(args, now)
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        key, rec = await store.create(org=args.org, user=args.user, role=args.role,
                                      name=args.name, expires=expires, now=now)
    finally:
        await store.db.aclose()
    await _announce(bus, ApiKeyCreated(key_hash=rec.key_hash))
    _print(args, {**rec.public(now), "key": key},
           f"created {rec.id} for {rec.user}@{rec.org} (role {rec.role})\n{key}\n"
           "(this is the only time the key is shown)")
    return 0


def _expiry(args: argparse.Namespace, now: float) -> float | None:
    """When the new key expires (None: never). Raises ValueError naming the option."""
    try:
        if args.expires_in:
            return now + parse_duration(args.expires_in)
        return parse_instant(args.expires_at) if args.expires_at else None
    except ValueError as exc:
        option = "--expires-in" if args.expires_in else "--expires-at"
        raise ValueError(f"{option}: {exc}") from None


async def _list(args: argparse.Namespace) -> int:
    path, _ = _target(args)
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rows = await store.records()
    finally:
        await store.db.aclose()
    now = time.time()
    data = [r.public(now) for r in rows]
    lines = [_LIST_ROW.format(r.id, f"{r.prefix}…", f"{r.org}/{r.user}", r.role, r.status(now))
             for r in rows]
    header = _LIST_ROW.format("id", "prefix", "org/user", "role", "status")
    _print(args, data, "\n".join([header, *lines]) if lines else "no keys")
    return 0


async def _revoke(args: argparse.Namespace) -> int:
    path, bus = _target(args)
    store = ApiKeyStore(LazyDb(path, [API_KEYS]))
    try:
        rec = await store.revoke(args.key_id, time.time())
    finally:
        await store.db.aclose()
    if rec is None:
        sys.stderr.write(f"llmgw keys: no key {args.key_id!r}\n")
        return 1
    await _announce(bus, ApiKeyRevoked(key_hash=rec.key_hash))
    _print(args, rec.public(time.time()), f"revoked {rec.id}")
    return 0
