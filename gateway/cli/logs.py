"""``llmgw logs [--since 10m] [--model M]``: read the request log.

Asks the gateway's StoreActor (``log query``, which commits what is buffered first) through
an ingress's admin API (``--url``), over the bus (``--bus``), or through the local socket of
a gateway serving the database on this machine (``gateway.admin.local_socket``); with none of them
(or ``--db``, or a socket file nobody answers on: left by a gateway that was killed), reads the
log where it is kept (``gateway.cli.logs_offline``): PostgreSQL when ``database.url`` (or
``LLMGW_DATABASE_URL``) names it, else the database file (``--db``, else
``database.path`` of ``--config``, else ``llmgw.sqlite3``; WAL lets it read while the gateway
writes). One row per
client request (``request``) and per upstream attempt (``attempt``), oldest first; a table,
or JSON lines with ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
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
    admin_key,
    admin_over_http,
    bus_url,
    fail,
    parse_since,
    settings,
)
from schemas import GatewayError

if TYPE_CHECKING:
    import argparse

_TIMEOUT_S = 30.0

_TABLE = (
    ("time", 19),
    ("kind", 7),
    ("request_id", 12),
    ("requested", 14),
    ("model", 14),
    ("endpoint", 24),
    ("status", 6),
    ("att", 3),
    ("fb", 2),
    ("latency_ms", 10),
    ("ttft_ms", 8),
    ("tokens", 9),
    ("cost_usd", 10),
    ("error_kind", 14),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``llmgw logs``."""
    p = sub.add_parser("logs", help="query the request log")
    p.add_argument(
        "--since", default="1h", help="how far back (10m, 2h, 1d; unix seconds; ISO 8601; 1h)"
    )
    p.add_argument("--model", help="requested or resolved model id")
    p.add_argument("--kind", choices=("request", "attempt"), help="only requests or attempts")
    p.add_argument("--request-id", help="one request's rows")
    p.add_argument("--limit", type=int, default=100, help="at most this many rows (newest)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--db", help="read this database file (default: database.path of --config)")
    p.add_argument("--config", help="config file naming the database (and the bus)")
    p.add_argument("--bus", help="ask the gateway's StoreActor over this bus, nats://HOST:PORT")
    p.add_argument("--url", help="ask an ingress's admin API, http://HOST:PORT (admin key)")
    p.add_argument("--admin-key", help="admin key for --url (default $LLMGW_ADMIN_KEY)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the matching rows."""
    try:
        if args.limit < 1:  # refused here, before any path: each said it its own way
            raise UsageError(f"--limit: at least 1 row, not {args.limit}")
        query = {
            "since": parse_since(args.since),
            "model": args.model,
            "kind": args.kind,
            "request_id": args.request_id,
            "limit": args.limit,
        }
        rows = _rows(args, query)
    except (UsageError, ValueError) as exc:
        return fail("logs", str(exc))
    except (GatewayError, NotDeliveredError, RefusedError) as exc:
        return fail("logs", exc.message if isinstance(exc, GatewayError) else str(exc), 1)
    except httpx.HTTPError as exc:
        return fail("logs", f"cannot reach the gateway: {type(exc).__name__}: {exc}", 1)
    except LogFileError as exc:
        return fail("logs", f"cannot read the request log: {exc}", 1)
    _print(rows, as_json=args.json)
    return 0


def _rows(args: argparse.Namespace, query: dict[str, Any]) -> list[dict[str, Any]]:
    """From ``--db``, ``--url``, ``--bus``, the local socket, else the database file."""
    if args.db:
        return _from_file(_existing(Path(args.db)), query)
    if args.url:
        return _over_http(Target(url=args.url, key=admin_key(args)), query)
    if args.bus:
        return asyncio.run(_over_bus(bus_url(args), query))
    config = settings(args).database
    database = Path(config.path)
    local = socket_path(database)
    # A socket file that refuses connections was left by a gateway that died (kill -9): no
    # gateway serves the file, so it is read directly, as when there is no socket at all.
    if answers(local):
        return _over_http(Target(socket=str(local)), query)
    if config.url:
        return _from_postgres(config.url, query)
    return _from_file(_existing(database), query)


def _existing(path: Path) -> Path:
    if not path.exists():
        raise UsageError(f"no database at {path} (--db PATH, or --config FILE)")
    return path


def _from_file(path: Path, query: dict[str, Any]) -> list[dict[str, Any]]:
    """Read the file itself (no gateway serves it). Imported here only: the offline reader
    needs the actors' package, which the CLI loads for this case alone."""
    from gateway.cli.logs_offline import read_rows

    return read_rows(path, query)


def _from_postgres(url: str, query: dict[str, Any]) -> list[dict[str, Any]]:
    """Read the log's PostgreSQL database (no gateway serves it here); as ``_from_file``."""
    from gateway.cli.logs_offline import read_rows_postgres

    return read_rows_postgres(url, query)


async def _over_bus(url: str, query: dict[str, Any]) -> list[dict[str, Any]]:
    bus = await open_bus(url, name="llmgw-logs", connect_timeout=_TIMEOUT_S)
    try:
        result = await admin_request(bus, "log", "query", query, by="cli", timeout=_TIMEOUT_S)
    finally:
        await bus.aclose()
    rows: list[dict[str, Any]] = result.get("rows", [])
    return rows


def _over_http(where: Target, query: dict[str, Any]) -> list[dict[str, Any]]:
    result = admin_over_http(where, "log", "query", query, _TIMEOUT_S)
    rows: list[dict[str, Any]] = result.get("rows", [])
    return rows


# A caller chooses the model name it asks for: its control characters are shown escaped, so
# it can neither forge a row (a newline) nor drive the operator's terminal (an escape).
_CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0))}


def _print(rows: list[dict[str, Any]], *, as_json: bool) -> None:
    out = sys.stdout
    if as_json:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
        return
    out.write("  ".join(name.ljust(width) for name, width in _TABLE).rstrip() + "\n")
    for row in rows:
        cells = {
            **row,
            "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["ts"])),
            "requested": row["requested_model"],
            "att": row["attempt"],
            "fb": "y" if row["fallback"] else "",
            "latency_ms": f"{row['latency_ms']:.1f}",
            "ttft_ms": "" if row["ttft_ms"] is None else f"{row['ttft_ms']:.1f}",
            "tokens": f"{row['prompt_tokens']}/{row['completion_tokens']}",
            # ~: priced from the gateway's estimate (the upstream reported no usage)
            "cost_usd": f"{'~' if row.get('cost_estimated') else ''}{row.get('cost_usd', 0):.6f}",
        }
        out.write(
            "  ".join(
                str(cells[name] if cells[name] is not None else "").translate(_CONTROL).ljust(width)
                for name, width in _TABLE
            ).rstrip()
            + "\n"
        )
