"""Background work beside the actors that needs upstream I/O (actors never do any): the
health-check loop over local deployments, the bench prober, the RouteWise latency prober and
the quota poller (http_json quota sources). Runs in the process that owns the actors (role
``all`` or ``actors``).

A reload reaches them like it reaches an ingress (:meth:`Sidecars.follow`: on
``ConfigChanged`` the config file is re-read): the quota poller polls the pools the reload
added or changed and stops polling the removed ones, the probers resolve routes from the new
config, and the health-check loop restarts when its targets or settings changed.

In a cluster (several actors hosts) the loops that feed one unit of the tree run only beside
that unit's owner (:meth:`Sidecars.place`): the health checks feed the ``models`` unit, the
quota polls the ``capacity`` unit, and N hosts must not send N times their traffic. The bench
and RouteWise probers need no placement: each probe is asked for once, by the owning actor,
and taken by one prober of the queue group.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bus import BusClosedError
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.auth.provider_secrets import ProviderSecrets, configured_credentials
from gateway.ingress.plan_walk import FallbackTargets, Targets
from gateway.ingress.settling import LeaseKeeper
from gateway.process.healthcheck import HealthChecker, local_targets
from gateway.process.prober import BenchProber
from gateway.process.quota_poller import QuotaPoller
from gateway.process.reload import ConfigFollower
from gateway.process.routewise_prober import RouteWiseProber

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from schemas.config import GatewayConfig, HealthCheckConfig

logger = logging.getLogger(__name__)

# The units of the actor tree (actors/tree.py) the loops feed; a test pins the names.
HEALTH_CHECKED_UNIT = "models"
QUOTA_POLLED_UNIT = "capacity"


class Sidecars:
    """Owns the sidecar tasks and the HTTP client they share; ``aclose`` stops them."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._config = config
        self._client = make_http_client(config.server.max_upstream_answer_bytes)
        self._tasks: list[asyncio.Task[None]] = []
        self._leases = LeaseKeeper(bus, config.routing.leases.ttl_seconds, "prober")
        # Database keys' secrets by grant from their owner, as the ingress gets them (this
        # runs beside the actors but is not one: it never opens their file).
        self._grants = grants = ProviderSecrets(bus, configured_credentials(config))
        self.prober = BenchProber(
            bus, make_adapters(self._client), Targets(config, grants), self._leases, grants
        )
        # Following the declarations drops a deleted key's grant at once.
        self._tasks.append(asyncio.create_task(grants.start()))
        self._tasks.append(asyncio.create_task(self.prober.run()))
        self.routewise = RouteWiseProber(
            bus, make_adapters(self._client), Targets(config, grants), self._leases, grants
        )
        self._tasks.append(asyncio.create_task(self.routewise.run()))
        self.poller = QuotaPoller(bus, self._client)
        self._health: tuple[dict[str, str], HealthCheckConfig] | None = None
        self._checker: asyncio.Task[None] | None = None
        self._here: frozenset[str] | None = None  # the units run here; None: the whole tree
        self._feeding = False  # the actors started and we are not closed

    def actors_started(self) -> None:
        """Start what feeds the actors (quota readings, health checks): a reading published
        before its owner subscribed would be lost. The probers are listening already, so an
        actor's first probe request, sent as it starts, reaches one."""
        self._feeding = True
        self._feed(self._config)

    def place(self, units: list[str]) -> None:
        """In a cluster: this host runs ``units`` of the tree now, and feeds only those."""
        self._here = frozenset(units)
        if self._feeding:
            self._feed(self._config)

    def _runs(self, unit: str) -> bool:
        return self._here is None or unit in self._here

    def _feed(self, config: GatewayConfig) -> None:
        self.poller.reconfigure(config, polling=self._runs(QUOTA_POLLED_UNIT))
        self._check(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Work from ``config`` from now on (a reload)."""
        targets = FallbackTargets(config, Targets(self._config, self._grants), self._grants)
        self.prober.retarget(targets)
        self.routewise.retarget(targets)
        self._leases.retune(config.routing.leases.ttl_seconds)
        self._client.max_answer_bytes = config.server.max_upstream_answer_bytes
        self._feed(config)
        self._config = config

    def follow(self, load: Callable[[], tuple[GatewayConfig, str]], version: str) -> None:
        """Apply every reload from now on: ``load`` re-reads and validates the config file
        (as :class:`~gateway.process.reload.ConfigFollower` does for an ingress)."""
        follower = ConfigFollower(self, load, version, who="sidecars")
        self._tasks.append(asyncio.create_task(self._follow(follower), name="sidecars:reload"))

    async def _follow(self, follower: ConfigFollower) -> None:
        try:
            await follower.follow(self._bus)
        except BusClosedError as exc:
            logger.error("sidecars no longer follow config reloads: %s", exc)

    def _check(self, config: GatewayConfig) -> None:
        """(Re)start the health-check loop when its targets or settings changed, or its
        unit came here or went elsewhere."""
        settings = config.routing.health_check
        targets = local_targets(config)
        here = self._runs(HEALTH_CHECKED_UNIT)
        wanted = (targets, settings) if here and settings.enabled and targets else None
        if wanted == self._health:
            return
        if self._checker is not None:
            self._checker.cancel()
            self._checker = None
        self._health = wanted
        if wanted is not None:
            checker = HealthChecker(self._bus, targets, settings, self._client)
            self._checker = asyncio.create_task(checker.run(), name="sidecars:health-check")

    async def aclose(self) -> None:
        """Cancel every task and close the client."""
        self._feeding = False  # the host, stopping after us, reports its units going
        tasks = [*self._tasks, *([self._checker] if self._checker is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.poller.aclose()
        await self._leases.aclose()
        await self._grants.aclose()
        await self._client.aclose()
