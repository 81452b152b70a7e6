"""``llmgw keys create|list|revoke``: gateway API keys, through their owner when it runs.

The keys belong to the ApiKeyAdminActor. When a gateway runs, the command is an ``api_keys``
admin command sent to it: over the bus when the config (``--config``) names a NATS bus and an
owner answers there, else through the local socket beside the database (``--db PATH`` or the
config's ``database.path``; see ``gateway.admin.local_socket``); the owner announces the change
so every ingress drops its cached copy at once (``gateway.cli.keys_owner``). Only when nothing
answers, neither on the bus nor on the socket (the first admin key is made before any gateway
runs), does the command write the database file itself (``gateway.cli.keys_offline``, the one
isolated direct path) and announce on the NATS bus if there is one. When the socket answers, a
gateway runs on the file and its keys are its owner's: a command it cannot deliver (its bus
reconnecting, the owner silent) fails (exit 2, one line: retry; after a timeout the outcome is
unknown, check with ``llmgw keys list``) and the file is left alone. The key is printed once,
at creation, with where it went (the gateway that took it, or the database file written).

``--url http://HOST:PORT`` (with the admin key) or ``--bus nats://HOST:PORT`` name the owner,
as ``llmgw admin`` does: the command goes there and nowhere else; when it is not delivered
the command fails (exit 2) and no file is read or written.

A database is only ever one the operator named: with neither ``--config`` nor ``--db`` the
command uses ``./llmgw.sqlite3`` (``llmgw serve``'s default) only when that file exists, and
otherwise refuses (exit 2) rather than create a stray file no gateway reads.

``create --rpm/--tpm/--concurrency/--budget 10/month`` also gives the key a limit: sent to
its owner (admin ``limits set``) the same way, else, with no gateway running, stored in the
owner's ``limits`` table (offline), which the LimitsActor loads when it starts (so a first key
made before any gateway runs keeps its limit). A key a gateway made whose limit it then does not
take is still printed (it exists), and the command fails naming the key's id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from gateway.admin.http import ADMIN_TIMEOUT_S
from gateway.cli.common import (
    NotDeliveredError,
    OwnerUnreachableError,
    RefusedError,
    Target,
    UsageError,
    admin_key,
    admin_over_http,
    bus_url,
    not_reached,
)
from gateway.cli.keys_owner import NoGatewayError, announce, reach_owner
from gateway.process.config import ConfigError, load_sections, redacted
from schemas import ApiKeyCreated, ApiKeyRevoked, GatewayError
from schemas.keys import ROLES, expiry_problem, parse_duration, parse_instant
from schemas.limits import spec_arg

if TYPE_CHECKING:
    import argparse

logger = logging.getLogger(__name__)

_LIST_ROW = "{:16}  {:14}  {:24}  {:8}  {}"


def register(sub: Any) -> None:
    """Add ``keys`` and its subcommands to the ``llmgw`` parser."""
    keys = sub.add_parser("keys", help="manage gateway API keys")
    verbs = keys.add_subparsers(dest="keys_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML config file whose database.path to use")
        p.add_argument("--db", help="the SQLite file (overrides --config)")
        p.add_argument("--url", help="an ingress, http://HOST:PORT (needs the admin key)")
        p.add_argument("--admin-key", help="admin key for --url (default $LLMGW_ADMIN_KEY)")
        p.add_argument("--bus", help="the gateway's bus, nats://HOST:PORT")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    create = verbs.add_parser("create", help="create a key (printed once)")
    common(create)
    create.add_argument("--org", required=True)
    create.add_argument("--user", required=True)
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", default="")
    create.add_argument("--expires-in", help="e.g. 3600, 90m, 12h, 30d")
    create.add_argument("--expires-at", help="ISO 8601 time (UTC unless it has an offset)")
    create.add_argument("--rpm", type=int, help="limit: requests per minute")
    create.add_argument("--tpm", type=int, help="limit: prompt+completion tokens per minute")
    create.add_argument("--concurrency", type=int, help="limit: requests in flight")
    create.add_argument("--budget", help="limit: USD per day|week|month, e.g. 10/month")
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
        except (ConfigError, ValueError, UsageError) as exc:
            sys.stderr.write(f"llmgw keys: {exc}\n")
            return 2
        except _FAILURES as exc:
            return _failed(exc)

    return func


_FAILURES = (OwnerUnreachableError, NotDeliveredError, httpx.HTTPError, RefusedError, GatewayError)


def _failed(exc: Exception, before: str = "") -> int:
    """Report a command that failed (``before`` it what was done); its exit code: 2 when it was
    not delivered, 1 when the owner refused it."""
    if isinstance(exc, OwnerUnreachableError):
        line, code = str(exc), 2
    elif isinstance(exc, NotDeliveredError | httpx.HTTPError):
        line, code = f"not delivered: {exc}", 2
    else:
        line, code = (exc.message if isinstance(exc, GatewayError) else str(exc)), 1
    sys.stderr.write(f"llmgw keys: {before}{redacted(line)}\n")
    return code


def _target(args: argparse.Namespace) -> tuple[str, str, bool]:
    """(absolute database path, NATS bus url or "", whether the config runs a cluster). Raises
    ValueError when neither ``--config`` nor ``--db`` names the database and the default file
    does not exist."""
    # Only the sections needed: the models' ${VAR}s need not be set to manage keys.
    config = (
        load_sections(args.config, "database", "bus", "cluster")
        if args.config or not args.db
        else None
    )
    path = args.db or (config.database.path if config else "")
    if not args.config and not args.db and not Path(path).exists():
        # A key written to a file no gateway reads is a key that silently does nothing.
        raise ValueError(
            f"no database named and no {path} here: name the gateway's with "
            "--config FILE (its database.path) or --db PATH"
        )
    bus = config.bus.url if config is not None and config.bus.url.startswith("nats://") else ""
    clustered = config is not None and config.cluster.enabled
    return str(Path(path).resolve()), bus, clustered


def _offline(path: str, bus: str, clustered: bool) -> None:
    """Allow the offline path on ``path`` (no gateway answered). Raises ValueError for a
    cluster's config: its keys are the cluster's (JetStream), and no host reads the file, so
    a key written there would be shown as made and refused everywhere."""
    if clustered:
        raise ValueError(
            f"no gateway of the cluster answered on {redacted(bus) or 'its bus'} and a cluster "
            f"never reads keys from {path}: start an actors host, or name a running gateway "
            "with --url or --bus"
        )


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    sys.stdout.write((json.dumps(data) if args.json else text) + "\n")


async def _named(
    args: argparse.Namespace, verb: str, values: dict[str, Any], *, area: str = "api_keys"
) -> dict[str, Any] | None:
    """The answer of the owner ``--url`` or ``--bus`` names; None when neither is given.
    Raises NotDeliveredError / httpx.HTTPError when it is not reached (never the file),
    OwnerUnreachableError when the gateway there does not reach the owner, RefusedError /
    GatewayError when it refuses, UsageError without an admin key for --url."""
    if args.url:
        where = Target(url=args.url, key=admin_key(args))
        try:
            return await asyncio.to_thread(
                admin_over_http, where, area, verb, values, ADMIN_TIMEOUT_S
            )
        except NotDeliveredError as exc:
            url, timed_out = redacted(args.url), exc.code == "bus_timeout"
            raise not_reached(url, area, verb, str(exc), timed_out=timed_out) from None
    if args.bus:
        try:
            return (await reach_owner("", bus_url(args), verb, values, area=area))[0]
        except NoGatewayError as exc:
            raise NotDeliveredError(str(exc)) from None
    return None


def _limit_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``limits set`` arguments of ``create``'s limit options (None: no limit). Raises
    ValueError for a bad one."""
    values = {
        k: getattr(args, k)
        for k in ("rpm", "tpm", "concurrency", "budget")
        if getattr(args, k) is not None
    }
    if not values:
        return None
    try:
        spec_arg(values)
    except GatewayError as exc:
        raise ValueError(exc.message) from None
    return values


async def _deliver_limit(path: str, bus_url: str, values: dict[str, Any], *, online: bool) -> str:
    """Give the new key's limit to its owner (``online``: a gateway answered the key's
    creation); how it went ("bus", "socket", "stored": no gateway runs). Raises
    OwnerUnreachableError when a gateway runs but its limits owner is not reached (never the
    file then), RefusedError / GatewayError when the owner refuses it, httpx.HTTPError."""
    try:
        if not online:
            raise NoGatewayError("no gateway answered the key's creation")
        return (await reach_owner(path, bus_url, "set", values, area="limits"))[1]
    except NoGatewayError as exc:
        logger.info("no gateway runs (%s); storing the limit", exc)
        from gateway.cli import keys_offline as cli_keys_offline

        await cli_keys_offline.store_limit(path, values)
        return "stored"


async def _create(args: argparse.Namespace) -> int:
    expires = _expiry(args, time.time())
    limit = _limit_args(args)
    values: dict[str, Any] = {"org": args.org, "user": args.user, "role": args.role}
    if args.name:
        values["name"] = args.name
    if expires is not None:
        values["expires_at"] = expires
    named = await _named(args, "create", values)
    if named is not None:
        return await _created_by_named(args, named, limit)
    path, bus, clustered = _target(args)
    try:
        made, via = await reach_owner(path, bus, "create", values)
        served = redacted(bus) if via == "bus" else f"serving {path}"
        where = f"through the gateway {'on ' if via == 'bus' else ''}{served}"
    except NoGatewayError:
        _offline(path, bus, clustered)
        from gateway.cli import keys_offline as cli_keys_offline

        via = "file"
        made, key_hash = await cli_keys_offline.create(
            path, org=args.org, user=args.user, role=args.role, name=args.name, expires=expires
        )
        await announce(bus, ApiKeyCreated(key_hash=key_hash))
        where = f"into {path} (no gateway answered; one serving this file uses it)"
    made = {**made, "via": via, "database": "" if via == "bus" else path}
    failure: Exception | None = None
    if limit is not None:
        try:
            delivered = await _deliver_limit(
                path, bus, {**limit, "kind": "key", "id": made["id"]}, online=via != "file"
            )
        except _FAILURES as exc:  # the key exists all the same: show it, then say so
            delivered, failure = "", exc
        made = {**made, "limit": limit, "limit_delivered": delivered}
    _print(
        args,
        made,
        f"created {made['id']} for {made['user']}@{made['org']} (role {made['role']}) {where}\n"
        f"{made['key']}\n(this is the only time the key is shown)",
    )
    return 0 if failure is None else _failed(failure, _limit_not_set(made["id"]))


def _limit_not_set(key_id: str) -> str:
    return (
        f"key {key_id} was created but its limit was not set (set it with `llmgw admin limits "
        f"set --arg kind=key --arg id={key_id} ...`, or revoke the key): "
    )


async def _created_by_named(
    args: argparse.Namespace, made: dict[str, Any], limit: dict[str, Any] | None
) -> int:
    """Report a key the owner named by ``--url`` / ``--bus`` made, its limit sent there too."""
    via = "url" if args.url else "bus"
    made = {**made, "via": via, "database": ""}
    failure: Exception | None = None
    if limit is not None:
        try:
            await _named(args, "set", {**limit, "kind": "key", "id": made["id"]}, area="limits")
        except _FAILURES as exc:  # the key exists all the same: show it, then say so
            failure = exc
        made = {**made, "limit": limit, "limit_delivered": "" if failure else via}
    where = redacted(args.url or args.bus)
    _print(
        args,
        made,
        f"created {made['id']} for {made['user']}@{made['org']} (role {made['role']}) "
        f"through the gateway on {where}\n"
        f"{made['key']}\n(this is the only time the key is shown)",
    )
    return 0 if failure is None else _failed(failure, _limit_not_set(made["id"]))


def _expiry(args: argparse.Namespace, now: float) -> float | None:
    """When the new key expires (None: never). Raises ValueError naming the option."""
    if args.expires_in and args.expires_at:  # the owner refuses both too
        raise ValueError("give one of --expires-in and --expires-at")
    option = "--expires-in" if args.expires_in else "--expires-at"
    try:
        if args.expires_in:
            expires: float | None = now + parse_duration(args.expires_in)
        else:
            expires = parse_instant(args.expires_at) if args.expires_at else None
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    problem = expiry_problem(expires, now)  # the owner refuses it too; this names the option
    if problem is not None:
        raise ValueError(f"{option}: {problem}")
    return expires


async def _list(args: argparse.Namespace) -> int:
    named = await _named(args, "list", {})
    rows: list[dict[str, Any]]
    if named is not None:
        rows = named["data"]
    else:
        rows = await _listed_locally(args)
    lines = [
        _LIST_ROW.format(
            r["id"], f"{r['prefix']}…", f"{r['org']}/{r['user']}", r["role"], r["status"]
        )
        for r in rows
    ]
    header = _LIST_ROW.format("id", "prefix", "org/user", "role", "status")
    _print(args, rows, "\n".join([header, *lines]) if lines else "no keys")
    return 0


async def _listed_locally(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The keys from the gateway serving the named database, else from the file."""
    path, bus, clustered = _target(args)
    try:
        rows: list[dict[str, Any]] = (await reach_owner(path, bus, "list", {}))[0]["data"]
    except NoGatewayError:
        _offline(path, bus, clustered)
        from gateway.cli import keys_offline as cli_keys_offline

        rows = await cli_keys_offline.listing(path)
    return rows


async def _revoke(args: argparse.Namespace) -> int:
    named = await _named(args, "revoke", {"id": args.key_id})
    if named is not None:
        _print(args, named, f"revoked {named['id']}")
        return 0
    path, bus, clustered = _target(args)
    try:
        revoked = (await reach_owner(path, bus, "revoke", {"id": args.key_id}))[0]
    except NoGatewayError:
        _offline(path, bus, clustered)
        from gateway.cli import keys_offline as cli_keys_offline

        found = await cli_keys_offline.revoke(path, args.key_id)
        if found is None:
            sys.stderr.write(f"llmgw keys: no key {args.key_id!r}\n")
            return 1
        revoked, key_hash = found
        await announce(bus, ApiKeyRevoked(key_hash=key_hash))
    _print(args, revoked, f"revoked {revoked['id']}")
    return 0
