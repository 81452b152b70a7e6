"""The background prober: re-validates a benched route or a muted credential with one tiny
request.

An EndpointActor (a benched route) or a KeyPoolActor (a muted credential) publishes
``ProbeDue`` (queue group ``probers``, so one prober takes each); the prober sends a one-token
chat completion with that credential (a route's probe: its first declared one) and publishes
the ``ProbeResult``, naming the credential it used, to both owners on the endpoint's
``probe_result`` subject: a success lifts the bench and that credential's mute together; a
failure re-benches the route (its own probe) or re-mutes the credential. It runs beside the
actors (which never do upstream I/O), in the process that owns them. A probe of a quota or
concurrency route takes a lease like any request; with none free it is skipped (the route
stays benched; its owner schedules the next probe).
"""

from __future__ import annotations

import functools
import logging

import msgspec

from gateway.ingress.failover import is_key_refusal
from gateway.process.ping import NoAdapterError, Pinger
from schemas import (
    QUOTA_EXHAUSTED,
    GatewayError,
    ProbeDue,
    ProbeResult,
    UpstreamError,
    subjects,
)

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 15.0


class BenchProber(Pinger):
    """Owns nothing but its subscription; each probe is independent."""

    async def probe(self, due: ProbeDue) -> ProbeResult:
        """Send the tiny request for ``due``; never raises for an upstream failure."""
        result = functools.partial(
            ProbeResult,
            endpoint=due.endpoint,
            credential_id=due.credential_id or due.candidate.credential_id,
            credential_only=bool(due.credential_id),
        )
        cid = due.credential_id
        candidate = (
            msgspec.structs.replace(due.candidate, credential_id=cid) if cid else due.candidate
        )
        try:
            await self.ping(candidate, due.model, PROBE_TIMEOUT_SECONDS)
        except NoAdapterError:
            return result(ok=False, detail="no adapter")
        except UpstreamError as err:
            # A 4xx still proves the route answers; so does a rate limit (back-pressure, not
            # sickness: its pace is the key pool's to keep), but not an exhausted quota. A
            # muted key's probe asks about the key: the upstream refusing it says it is not back.
            limited = err.status == 429 and err.kind != QUOTA_EXHAUSTED
            ok = limited or not err.counts_against_endpoint
            if cid and is_key_refusal(err):
                ok = False
            return result(ok=ok, detail=err.message[:200])
        except TimeoutError:
            return result(ok=False, detail="timed out")
        return result(ok=True)

    async def handle(self, due: ProbeDue) -> ProbeResult | None:
        """Probe for ``due`` under a capacity lease when its route needs one, and publish the
        result; None when the route's pool has nothing free (the probe is skipped)."""
        result = await self.leased(due.candidate, f"probe:{due.endpoint}", lambda: self.probe(due))
        if result is None:
            logger.info("background probe of %s skipped: no capacity free", due.endpoint)
            return None
        logger.info(
            "background probe of %s: %s",
            result.endpoint,
            "ok" if result.ok else f"failed ({result.detail})",
        )
        try:
            await self._bus.publish(subjects.endpoint_probe_result(result.endpoint), result)
        except GatewayError as exc:
            logger.warning("probe result not published: %s", exc)
        return result

    async def run(self) -> None:
        """Serve ProbeDue events until cancelled."""
        async with self._bus.subscribe(subjects.PROBE_DUE, queue="probers") as sub:
            async for env in sub:
                if isinstance(env.message, ProbeDue):
                    await self.handle(env.message)
