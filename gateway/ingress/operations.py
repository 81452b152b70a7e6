"""What an operator gets from an ingress besides inference: :class:`IngressOps`.

One per app: the per-request accounting the app wraps its inference routes with, ``GET /metrics``,
``GET /events`` (SSE, admins), the HTTP admin API ``/admin/<area>/<verb>`` (admins), and
:meth:`IngressOps.run`, the background work — following config changes and counting operator
events for the metrics. (The process-level side is ``gateway.process.control``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

import anyio
import msgspec

from gateway.admin.event_stream import kinds_of, since_of, stream_events
from gateway.admin.http import (
    ADMIN_TIMEOUT_S,
    admin_request,
    args_of,
    command_of,
    refuse_get_of_change,
)
from gateway.auth.admin_access import requested_by, require_admin
from gateway.ingress.accounting import Accounting, LogOutbox
from gateway.ingress.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.telemetry import start_telemetry
from schemas import subjects

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)


_ADMIN_ONLY = "this endpoint needs the admin key (Authorization: Bearer)"


class ConfigFollower(Protocol):
    """What keeps this ingress on the current config version (the process's reload
    follower, ``gateway.process.reload.ConfigFollower``)."""

    async def follow(self, bus: Bus) -> None:
        """Follow config change events until cancelled."""
        ...

    def sync(self, announced: str | None = None) -> bool:
        """Serve the announced version (re-read now); whether the config changed."""
        ...


# Operator events the metrics count; not ``decision`` (one per request, every ingress's).
COUNTED_KINDS = (
    "circuit",
    "auth_rejected",
    "keypool",
    "bench",
    "mode",
    "config",
    "admin",
    "budget",
    "limits",
)
_SURFACES = {
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_SCRAPE_TIMEOUT_S = 2.0
_LOG_AREAS = frozenset({"log", "spend"})  # read from the request log
_DRAIN_S = 1.0
_encode = msgspec.json.Encoder().encode


class IngressOps:
    """Owns the ingress's metrics, accounting and operator routes."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._config = config
        # OpenTelemetry: None when ``telemetry.enabled`` is off (no SDK module is loaded).
        self.telemetry = start_telemetry(config)
        self.metrics = GatewayMetrics(
            config, self.telemetry.metrics if self.telemetry is not None else None
        )
        self.log_outbox = LogOutbox(bus, config.log) if config.log.enabled else None
        if self.log_outbox is not None:
            outbox = self.log_outbox
            self.metrics.count_log_drops(lambda: outbox.dropped)
        self.accounting = Accounting(
            bus,
            self.metrics,
            decisions=config.events.decisions,
            telemetry=self.telemetry,
            outbox=self.log_outbox,
        )
        self.follower: ConfigFollower | None = None
        # area -> what this ingress does once a command of that area succeeded through it
        self.after_admin: dict[str, Callable[[], Awaitable[None]]] = {}

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow a reloaded config."""
        self._config = config
        self.accounting.decisions = config.events.decisions
        self.metrics.reconfigure(config)
        if self.log_outbox is not None:
            self.log_outbox.reconfigure(config.log)

    async def start(self) -> None:
        """Start sending request-log rows to their owner."""
        if self.log_outbox is not None:
            self.log_outbox.start()

    async def aclose(self) -> None:
        """Deliver the request-log rows still kept (bounded wait), then stop sending; flush
        and stop the telemetry exporters (the SDK's shutdown blocks: a thread)."""
        if self.log_outbox is not None:
            await self.log_outbox.aclose()
        telemetry, self.telemetry = self.telemetry, None
        self.accounting.telemetry = None
        if telemetry is not None:
            await asyncio.to_thread(telemetry.shutdown)

    def sync_config(self, version: str | None = None) -> None:
        """Serve config ``version`` (None: whatever the file holds now) before returning;
        nothing before :meth:`run` gave this ingress its follower."""
        if self.follower is not None:
            self.follower.sync(version)

    async def run(self, follower: ConfigFollower) -> None:
        """Follow config changes with ``follower`` and count operator events, until
        cancelled. Raises BusClosedError when the bus ends a subscription."""
        self.follower = follower
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.follower.follow, self._bus)
            for kind in COUNTED_KINDS:
                tg.start_soon(self._count, kind)

    async def _count(self, kind: str) -> None:
        async with self._bus.subscribe(subjects.event(kind)) as sub:
            async for env in sub:
                self.metrics.count_event(env.subject, env.message)

    # -- routes -------------------------------------------------------------------------

    async def serve_metrics(self, req: HttpRequest) -> None:
        """``GET /metrics``: the Prometheus exposition."""
        body = await self.metrics.render(self._bus, _SCRAPE_TIMEOUT_S)
        await req.start(
            200,
            [
                (b"content-type", CONTENT_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        )
        await req.chunk(body, more=False)

    def _require_admin(self, req: HttpRequest) -> None:
        require_admin(
            req, self._config, "this endpoint needs the admin key (Authorization: Bearer)"
        )

    async def serve_events(self, req: HttpRequest) -> None:
        """``GET /events``: the event stream (admin)."""
        self._require_admin(req)
        await stream_events(req, self._bus, kinds_of(req), since_of(req))

    async def serve_admin(self, req: HttpRequest) -> None:
        """``GET``/``POST /admin/<area>/<verb>``: one admin command (admin)."""
        self._require_admin(req)
        area, verb = command_of(req)
        refuse_get_of_change(req, area, verb)
        if area in _LOG_AREAS and self.log_outbox is not None:
            # Read your writes: the rows of requests this ingress answered reach the store
            # before the query does (bounded: a store that is away answers what it has).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_S):
                    await self.log_outbox.drained()
        result = await admin_request(
            self._bus,
            area,
            verb,
            await args_of(req),
            by=requested_by(req),
            timeout=ADMIN_TIMEOUT_S,
            request_id=req.request_id,
        )
        if (area, verb) == ("config", "reload"):
            # Answer only once this ingress serves the new config, so a client that
            # reloads and then asks for a new model is never refused by this process.
            self.sync_config(str(result.get("version", "")) or None)
        follow_up = self.after_admin.get(area)
        if follow_up is not None:
            await follow_up()
        await req.respond(200, _encode(result))
