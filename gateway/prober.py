"""The background prober: re-validates a benched route with one tiny request.

An EndpointActor publishes ``ProbeDue`` partway through a bench (queue group ``probers``, so
one prober takes each); the prober sends a one-token chat completion with the route's
credential and publishes the ``ProbeResult`` back to the owner, which lifts the bench on
success or benches again on failure. It runs beside the actors (which never do upstream I/O),
in the process that owns them.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from bus import Bus
from gateway.adapters.base import Adapter
from gateway.dispatch import Targets
from schemas import GatewayError, ProbeDue, ProbeResult, UpstreamError, subjects

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 15.0
_PING = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}


class BenchProber:
    """Owns nothing but its subscription; each probe is independent."""

    def __init__(self, bus: Bus, adapters: dict[str, Adapter], targets: Targets) -> None:
        self._bus = bus
        self._adapters = adapters
        self._targets = targets

    async def probe(self, due: ProbeDue) -> ProbeResult:
        """Send the tiny request for ``due``; never raises for an upstream failure."""
        cid = due.credential_id
        adapter = self._adapters.get(due.candidate.kind)
        if adapter is None:
            return ProbeResult(endpoint=due.endpoint, ok=False, detail="no adapter",
                               credential_id=cid)
        candidate = msgspec.structs.replace(due.candidate, credential_id=cid) if cid \
            else due.candidate
        target = self._targets.resolve(candidate)
        body = {"model": due.candidate.upstream_model or due.model, **_PING}
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                await adapter.complete(target, body)
        except UpstreamError as err:
            ok = not err.counts_against_endpoint  # a 4xx still proves the route answers
            return ProbeResult(endpoint=due.endpoint, ok=ok, detail=err.message[:200],
                               credential_id=cid)
        except TimeoutError:
            return ProbeResult(endpoint=due.endpoint, ok=False, detail="timed out",
                               credential_id=cid)
        return ProbeResult(endpoint=due.endpoint, ok=True, credential_id=cid)

    async def run(self) -> None:
        """Serve ProbeDue events until cancelled."""
        async with self._bus.subscribe(subjects.PROBE_DUE, queue="probers") as sub:
            async for env in sub:
                if isinstance(env.message, ProbeDue):
                    result = await self.probe(env.message)
                    logger.info("background probe of %s: %s", result.endpoint,
                                "ok" if result.ok else f"failed ({result.detail})")
                    try:
                        await self._bus.publish(subjects.endpoint_probe_result(result.endpoint),
                                                result)
                    except GatewayError as exc:
                        logger.warning("probe result not published: %s", exc)
