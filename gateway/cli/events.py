"""``llmgw events [--filter KIND] [--since 10m]``: tail the operator events live.

One JSON line per event on stdout (``{"kind": ..., "type": ..., <fields>}``), from any machine
that reaches the bus (``--bus nats://...``), from an ingress's ``GET /events`` (``--url``), or
from the local socket of a gateway on this machine (neither; see ``gateway.cli.common``).
``--since`` first replays what the gateway's stream ``LLMGW_EVENTS`` kept (JetStream on NATS,
a bounded in-memory stream on the in-process bus, asked through ``--url`` or the local socket).
A ``--filter`` naming no event kind is refused. Once following, it says so on stderr.
``--count N`` exits after N events.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import httpx

from bus import BusClosedError, Subscription, open_bus
from gateway.adapters.sse import SSEParser
from gateway.admin.event_stream import event_json, event_kind, unknown_kinds
from gateway.cli.common import (
    Target,
    UsageError,
    add_target_args,
    fail,
    http_client,
    parse_since,
    target,
)
from gateway.process.config import redacted
from schemas import GatewayError, subjects

if TYPE_CHECKING:
    import argparse

_CONNECT_TIMEOUT_S = 5.0  # a bus that accepts no connection is reported, not waited on


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``llmgw events``."""
    p = sub.add_parser("events", help="tail the gateway's operator events")
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KIND",
        help="only this kind (circuit, decision, config, admin, keypool, ...); "
        "repeatable or comma-separated",
    )
    p.add_argument(
        "--since", help="replay the events kept since then first (10m ago, unix seconds, ISO 8601)"
    )
    p.add_argument("--count", type=int, help="exit after this many events")
    add_target_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Follow events until interrupted (or ``--count`` of them)."""
    kinds = frozenset(k for f in args.filter for k in f.split(",") if k)
    try:
        problem = unknown_kinds(kinds)
        if problem:
            raise UsageError(f"--filter: {problem}")
        if args.count is not None and args.count < 1:  # no event would ever end it
            raise UsageError(f"--count: at least 1 event, not {args.count}")
        since = parse_since(args.since) if args.since else None
        where = target(args)
        if where.bus:
            return asyncio.run(_over_bus(where.bus, kinds, since, args.count))
        return _over_http(where, kinds, since, args.count)
    except UsageError as exc:
        return fail("events", str(exc))
    except httpx.ConnectError as exc:  # never connected: a connection error, as admin's
        return fail("events", f"cannot reach the gateway: {exc}")
    except (GatewayError, httpx.HTTPError) as exc:
        message = exc.message if isinstance(exc, GatewayError) else repr(exc)
        return fail("events", f"lost the gateway: {message}", 1)


def _following(where: str) -> None:
    sys.stderr.write(f"llmgw events: following {where}\n")
    sys.stderr.flush()


def _emit(line: bytes) -> None:
    sys.stdout.write(line.decode() + "\n")
    sys.stdout.flush()


async def _over_bus(url: str, kinds: frozenset[str], since: float | None, count: int | None) -> int:
    bus = await open_bus(url, name="llmgw-events", connect_timeout=_CONNECT_TIMEOUT_S)
    pattern = subjects.event(next(iter(kinds))) if len(kinds) == 1 else subjects.EVENTS_ANY
    subscribing: AbstractAsyncContextManager[Subscription]
    try:
        if since is not None:
            subscribing = bus.replay(pattern, stream=subjects.EVENTS_STREAM, since=since)
        else:
            subscribing = bus.subscribe(pattern)
        async with contextlib.AsyncExitStack() as stack:
            try:
                sub = await stack.enter_async_context(subscribing)
            except BusClosedError as exc:
                if since is None:
                    raise
                raise UsageError(
                    f"--since: the bus keeps no events here ({exc.message}); "
                    "it needs the NATS bus a gateway keeps them on"
                ) from None
            _following(f"{pattern} on {redacted(url)}")
            return await _relay(sub, kinds, count)
    finally:
        await bus.aclose()


async def _relay(sub: Subscription, kinds: frozenset[str], count: int | None) -> int:
    seen = 0
    async for env in sub:
        if kinds and event_kind(env.subject) not in kinds:
            continue
        _emit(event_json(env.subject, env.message))
        seen += 1
        if count is not None and seen >= count:
            return 0
    sys.stderr.write("llmgw events: the bus closed the subscription\n")
    return 1


def _over_http(where: Target, kinds: frozenset[str], since: float | None, count: int | None) -> int:
    params = {"kind": ",".join(sorted(kinds))} if kinds else {}
    if since is not None:
        params["since"] = repr(since)
    seen = 0
    parser = SSEParser()
    with http_client(where, None) as client, client.stream("GET", "/events", params=params) as resp:
        if resp.status_code != 200:
            resp.read()
            return fail("events", f"HTTP {resp.status_code}: {_error_message(resp)}", 1)
        _following(where.url + "/events" if where.url else where.socket)
        for chunk in resp.iter_bytes():
            for _, data in parser.feed(chunk):
                _emit(data)
                seen += 1
                if count is not None and seen >= count:
                    return 0
    return 1


def _error_message(resp: httpx.Response) -> str:
    """The ``error.message`` of an error answer, else the start of its text."""
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]
