"""The trace a running gateway logged, for ``llmgw replay --url | --bus``: its request rows
asked of the log's owner (the StoreActor's ``log query``, as ``llmgw logs`` asks it), and
the gateway API keys they name with their roles and limits, asked of the keys' and the
limits' owners, so the replay makes the same keys."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec

from bus import open_bus
from gateway.admin.http import admin_request
from gateway.cli.common import admin_over_http
from gateway.replay.trace import TraceKey, trace_from_log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.cli.common import Target
    from gateway.replay.trace import TraceRequest

    Ask = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]

PAGE = 10_000
"""The most rows the log's owner answers one query with."""
_TIMEOUT_S = 30.0
_ATTEMPT = ("attempt", "endpoint", "ts")  # with its request id, names an attempt row


def logged_trace(where: Target, since: float) -> tuple[list[TraceRequest], list[TraceKey]]:
    """The requests logged since ``since`` (Unix seconds) and their keys, asked over the
    bus (``where.bus``) or an ingress's admin API. Raises GatewayError, NotDeliveredError,
    RefusedError, httpx.HTTPError, ValueError (a row that is no request)."""
    return asyncio.run(_over_bus(where.bus, since) if where.bus else _over_http(where, since))


async def _over_bus(url: str, since: float) -> tuple[list[TraceRequest], list[TraceKey]]:
    bus = await open_bus(url, name="llmgw-replay", connect_timeout=_TIMEOUT_S)

    async def ask(area: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return await admin_request(bus, area, verb, args, by="cli", timeout=_TIMEOUT_S)

    try:
        return await _collect(ask, since)
    finally:
        await bus.aclose()


async def _over_http(where: Target, since: float) -> tuple[list[TraceRequest], list[TraceKey]]:
    async def ask(area: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return admin_over_http(where, area, verb, args, _TIMEOUT_S)

    return await _collect(ask, since)


async def _collect(ask: Ask, since: float) -> tuple[list[TraceRequest], list[TraceKey]]:
    rows = await logged_rows(ask, since)
    attempts = await logged_rows(ask, since, kind="attempt")  # each request's own size
    named = {str(row.get("key_id") or "") for row in rows} - {""}
    keys = await _keys(ask, named) if named else []
    return trace_from_log([*rows, *attempts]), keys


async def logged_rows(
    ask: Ask, since: float, page_rows: int = PAGE, kind: str = "request"
) -> list[dict[str, Any]]:
    """The rows of ``kind`` (request or attempt) since ``since``, ``page_rows`` at a time
    (the newest first)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    until: float | None = None
    while True:
        query: dict[str, Any] = {"since": since, "kind": kind, "limit": page_rows}
        if until is not None:
            query["until"] = until
        page: list[dict[str, Any]] = (await ask("log", "query", query)).get("rows", [])
        for row in page:
            rid = str(row.get("request_id"))
            key = (rid,) if kind == "request" else (rid, *(str(row.get(c)) for c in _ATTEMPT))
            rows.setdefault(key, row)
        if len(page) < page_rows:
            break
        # Just past the oldest row's time: rows sharing it come again (once each, by id).
        until = min(float(row["ts"]) for row in page) + 1e-6
    return sorted(rows.values(), key=lambda row: float(row.get("ts") or 0.0))


async def _keys(ask: Ask, named: set[str]) -> list[TraceKey]:
    """The keys ``named`` (by id) as the trace declares them: role, organisation, and the
    key's own limit, else its role's default (user and organisation limits stay behind).
    Raises msgspec.ValidationError for a key of a role this replay does not know."""
    records = (await ask("api_keys", "list", {})).get("data", [])
    limits = (await ask("limits", "get", {})).get("limits", {})
    out = []
    for record in sorted(records, key=lambda r: str(r.get("id"))):
        key_id = str(record.get("id"))
        if key_id not in named:
            continue
        role = str(record.get("role") or "free")
        spec = limits.get(f"key:{key_id}") or limits.get(f"role:{role}")
        declared = {"kind": "key", "name": key_id, "role": role, "limits": spec or None}
        declared["org"] = str(record.get("org") or "replay")
        out.append(msgspec.convert(declared, TraceKey))  # a role it does not know: refused
    return out
