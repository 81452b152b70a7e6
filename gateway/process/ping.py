"""One tiny request to a route, as both background probers send it.

``Pinger`` owns what the bench prober and the RouteWise prober share: the adapters, the
route targets (retargeted on reload), the secret grants of database keys, and the capacity
lease a probe of a quota or concurrency route takes like any request.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

from gateway.ingress.clock import SYSTEM_CLOCK, IngressClock
from gateway.ingress.settling import LeaseKeeper

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from bus import Bus
    from gateway.adapters.base import Adapter
    from gateway.auth.provider_secrets import ProviderSecrets
    from gateway.ingress.plan_walk import Targets
    from schemas import RouteCandidate

T = TypeVar("T")

PING = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}


class NoAdapterError(LookupError):
    """No adapter serves the candidate's upstream kind."""


class Pinger:
    """Sends one-token chat completions to routes; owns no state beyond its collaborators."""

    def __init__(
        self,
        bus: Bus,
        adapters: dict[str, Adapter],
        targets: Targets,
        leases: LeaseKeeper | None = None,
        secrets: ProviderSecrets | None = None,
        *,
        clock: IngressClock = SYSTEM_CLOCK,
    ) -> None:
        self._bus = bus
        self._clock = clock  # what a probe's timing reads (the replay's virtual clock)
        self._adapters = adapters
        self._targets = targets
        self._leases = leases or LeaseKeeper(bus, 30.0, "prober")
        self._secrets = secrets  # the grants ``targets`` reads database keys' secrets from

    def retarget(self, targets: Targets) -> None:
        """Resolve routes from ``targets`` from the next probe on (a reload)."""
        self._targets = targets

    async def ping(self, candidate: RouteCandidate, model: str, timeout: float) -> None:
        """Send the one-token request to ``candidate``. Raises NoAdapterError, UpstreamError,
        TimeoutError."""
        adapter = self._adapters.get(candidate.kind)
        if adapter is None:
            raise NoAdapterError(candidate.kind)
        if self._secrets is not None:
            await self._secrets.ensure_credential(candidate.credential_id)
        target = self._targets.resolve(candidate)
        body = {"model": candidate.upstream_model or model, **PING}
        async with asyncio.timeout(timeout):
            await adapter.complete(target, body)

    async def leased(
        self, candidate: RouteCandidate, holder: str, probe: Callable[[], Awaitable[T]]
    ) -> T | None:
        """``probe()`` under ``candidate``'s capacity lease when its route has a pool; None
        (not run) when the pool has nothing free. The lease is given back however it ends."""
        leased = candidate
        if candidate.pool:
            got = await self._leases.acquire(candidate, holder)
            if got is None:
                return None
            leased = got
        try:
            return await probe()
        finally:
            await self._leases.release(leased)
