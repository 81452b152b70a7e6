"""Background work beside the actors that needs upstream I/O (actors never do any): the
health-check loop over local deployments, the bench prober and the quota poller (http_json
quota sources). Runs in the process that owns the actors (role ``all`` or ``actors``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gateway.adapters.registry import make_adapters, make_http_client
from gateway.dispatch import Targets
from gateway.healthcheck import HealthChecker, local_targets
from gateway.leases import LeaseKeeper
from gateway.prober import BenchProber
from gateway.provider_secrets import ProviderSecrets, configured_credentials
from gateway.quota_poller import QuotaPoller

if TYPE_CHECKING:
    from bus import Bus
    from schemas.config import GatewayConfig


class Sidecars:
    """Owns the sidecar tasks and the HTTP client they share; ``aclose`` stops them."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._client = make_http_client()
        self._tasks: list[asyncio.Task[None]] = []
        self._leases = LeaseKeeper(bus, config.routing.leases.ttl_seconds, "prober")
        # Database keys' secrets by grant from their owner, as the ingress gets them (this
        # runs beside the actors but is not one: it never opens their file).
        self._grants = grants = ProviderSecrets(bus, configured_credentials(config))
        prober = BenchProber(bus, make_adapters(self._client), Targets(config, grants),
                             self._leases, grants)
        # Following the declarations drops a deleted key's grant at once.
        self._tasks.append(asyncio.create_task(grants.start()))
        self._tasks.append(asyncio.create_task(prober.run()))
        secrets = {eid: (route.secrets[0] if route.secrets else None)
                   for m in config.models
                   for eid, route in zip(m.endpoint_ids(), m.route, strict=True)}
        poller = QuotaPoller(bus, config, self._client, secrets)
        if poller.pools:
            self._tasks.append(asyncio.create_task(poller.run()))
        settings = config.routing.health_check
        targets = local_targets(config)
        if settings.enabled and targets:
            checker = HealthChecker(bus, targets, settings, self._client)
            self._tasks.append(asyncio.create_task(checker.run()))

    async def aclose(self) -> None:
        """Cancel every task and close the client."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leases.aclose()
        await self._grants.aclose()
        await self._client.aclose()
