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
import functools
import logging

from gateway.process.ping import NoAdapterError, Pinger
from schemas import GatewayError, LatencyProbeDue, LatencySample, UpstreamError, subjects
from schemas.errors import UnusableAnswerError

logger = logging.getLogger(__name__)


class RouteWiseProber(Pinger):
    """Owns nothing but its subscription; each probe is independent."""

    async def probe(self, due: LatencyProbeDue) -> LatencySample:
        """Send the 1-token request for ``due``; never raises for an upstream failure."""
        sample = functools.partial(LatencySample, endpoint=due.endpoint, model=due.model)
        steady, wall = self._clock.steady, self._clock.wall
        started = steady()
        try:
            await self.ping(due.candidate, due.model, due.timeout)
        except NoAdapterError:
            return sample(ok=False, detail="no adapter", ts=wall())
        except UnusableAnswerError:
            pass  # it answered (empty, as a one-token ask may be): its time is a latency
        except UpstreamError as err:
            return sample(ok=False, detail=err.message[:200], ts=wall())
        except TimeoutError:
            return sample(ok=False, detail="timed out", ts=wall())
        return sample(ok=True, ttft_ms=(steady() - started) * 1000, ts=wall())

    async def _answer(self, due: LatencyProbeDue) -> None:
        sample = await self.leased(
            due.candidate, f"latency-probe:{due.endpoint}", lambda: self.probe(due)
        )
        if sample is None:
            logger.debug("routewise probe of %s skipped: no capacity free", due.endpoint)
            return
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
