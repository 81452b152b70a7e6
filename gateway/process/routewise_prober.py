"""The RouteWise active prober: one 1-token request to an idle or never-measured route.

A RouteWise ModelActor publishes ``LatencyProbeDue`` (queue group ``routewise-probers``, so
one prober across every process takes each) for the routes its LP has no recent evidence of;
the prober times the answer of a one-token chat completion with the route's credential and
publishes a ``LatencySample`` to that model only (``llmgw.model.<id>.latency``). It feeds the
latency profile, never the circuit or the bench: a probe is not client traffic. It runs
beside the actors (which never do upstream I/O), in the process that owns them. A probe of a
quota or concurrency route takes a lease like any request (the bench prober's way); with
none free it is skipped (the ModelActor asks again on its next round).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from gateway.ingress.leases import LeaseKeeper
from schemas import GatewayError, LatencyProbeDue, LatencySample, UpstreamError, subjects

if TYPE_CHECKING:
    from bus import Bus
    from gateway.adapters.base import Adapter
    from gateway.auth.provider_secrets import ProviderSecrets
    from gateway.ingress.dispatch import Targets

logger = logging.getLogger(__name__)

_PING = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}


class RouteWiseProber:
    """Owns nothing but its subscription; each probe is independent."""

    def __init__(
        self,
        bus: Bus,
        adapters: dict[str, Adapter],
        targets: Targets,
        leases: LeaseKeeper | None = None,
        secrets: ProviderSecrets | None = None,
    ) -> None:
        self._bus = bus
        self._adapters = adapters
        self._targets = targets
        self._leases = leases or LeaseKeeper(bus, 30.0, "prober")
        self._secrets = secrets  # the grants ``targets`` reads database keys' secrets from

    def retarget(self, targets: Targets) -> None:
        """Resolve routes from ``targets`` from the next probe on (a reload)."""
        self._targets = targets

    async def probe(self, due: LatencyProbeDue) -> LatencySample:
        """Send the 1-token request for ``due``; never raises for an upstream failure."""
        adapter = self._adapters.get(due.candidate.kind)
        if adapter is None:
            return LatencySample(
                endpoint=due.endpoint,
                model=due.model,
                ok=False,
                detail="no adapter",
                ts=time.time(),
            )
        if self._secrets is not None:
            await self._secrets.ensure_credential(due.candidate.credential_id)
        target = self._targets.resolve(due.candidate)
        body = {"model": due.candidate.upstream_model or due.model, **_PING}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(due.timeout):
                await adapter.complete(target, body)
        except UpstreamError as err:
            return LatencySample(
                endpoint=due.endpoint,
                model=due.model,
                ok=False,
                detail=err.message[:200],
                ts=time.time(),
            )
        except TimeoutError:
            return LatencySample(
                endpoint=due.endpoint, model=due.model, ok=False, detail="timed out", ts=time.time()
            )
        return LatencySample(
            endpoint=due.endpoint,
            model=due.model,
            ok=True,
            ttft_ms=(time.perf_counter() - started) * 1000,
            ts=time.time(),
        )

    async def _answer(self, due: LatencyProbeDue) -> None:
        leased = due.candidate
        if leased.pool:
            got = await self._leases.acquire(leased, f"latency-probe:{due.endpoint}")
            if got is None:
                logger.debug("routewise probe of %s skipped: no capacity free", due.endpoint)
                return
            leased = got
        try:
            sample = await self.probe(due)
        finally:
            await self._leases.release(leased)
        logger.debug(
            "routewise probe of %s: %s",
            due.endpoint,
            f"{sample.ttft_ms:.0f} ms" if sample.ok else sample.detail,
        )
        try:
            await self._bus.publish(subjects.model_latency(due.model), sample)
        except GatewayError as exc:
            logger.warning("routewise probe sample not published: %s", exc)

    async def run(self) -> None:
        """Serve LatencyProbeDue events until cancelled, each probe in its own task."""
        async with (
            asyncio.TaskGroup() as tg,
            self._bus.subscribe(subjects.ROUTEWISE_PROBE_DUE, queue="routewise-probers") as sub,
        ):
            async for env in sub:
                if isinstance(env.message, LatencyProbeDue):
                    tg.create_task(self._answer(env.message))
