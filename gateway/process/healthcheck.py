"""The health-check loop: poll local deployments' ``/health`` and publish ``LocalHealth``.

Spec (``health_check:``): it only influences the weight assignment (the local/remote split);
the circuit breaker stays the judge of endpoint health. It runs in the process that owns the
actors (role ``all`` or ``actors``), beside them rather than inside one, because actors never
perform upstream I/O.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from schemas import GatewayError, LocalHealth, subjects

if TYPE_CHECKING:
    from bus import Bus
    from gateway.adapters.upstream_http import UpstreamHTTP
    from schemas.config import GatewayConfig, HealthCheckConfig

logger = logging.getLogger(__name__)


def health_url(base_url: str, path: str) -> str:
    """``http://host:8000/v1`` + ``/health`` -> ``http://host:8000/health``."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return root + "/" + path.lstrip("/")


def local_targets(config: GatewayConfig) -> dict[str, str]:
    """Endpoint id -> health URL, for every route on a local host."""
    out: dict[str, str] = {}
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            # Bedrock serves no health path: its endpoint's health is its circuit's verdict.
            if route.kind == "bedrock":
                continue
            if route.base_url and route.location().startswith("local-"):
                out[eid] = health_url(route.base_url, config.routing.health_check.path)
    return out


class HealthChecker:
    """Owns the poll loop; publishes a LocalHealth when an endpoint's verdict changes."""

    def __init__(
        self, bus: Bus, targets: dict[str, str], settings: HealthCheckConfig, client: UpstreamHTTP
    ) -> None:
        self._bus = bus
        self._targets = targets
        self._settings = settings
        self._client = client
        self._last: dict[str, bool] = {}

    async def check_once(self) -> dict[str, bool]:
        """One pass over every target; returns the verdicts."""
        results = await asyncio.gather(*(self._probe(url) for url in self._targets.values()))
        verdicts = dict(zip(self._targets, results, strict=True))
        for endpoint, healthy in verdicts.items():
            if self._last.get(endpoint) != healthy:
                self._last[endpoint] = healthy
                log = logger.info if healthy else logger.warning
                log("health check: %s is %s", endpoint, "up" if healthy else "down")
                try:
                    await self._bus.publish(
                        subjects.endpoint_local_health(endpoint),
                        LocalHealth(endpoint=endpoint, healthy=healthy),
                    )
                except GatewayError as exc:
                    logger.warning("health verdict for %s not published: %s", endpoint, exc)
        return verdicts

    async def _probe(self, url: str) -> bool:
        status = await self._client.get_status(url, timeout=self._settings.timeout_seconds)
        return status is not None and status < 300

    async def run(self) -> None:
        """Check forever, every ``interval_seconds``."""
        while True:
            await self.check_once()
            await asyncio.sleep(self._settings.interval_seconds)
