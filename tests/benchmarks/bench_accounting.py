"""Hot-path cost of the ingress's per-request accounting (metrics, summary, decision event).

A script, not a test. From the repository root::

    python -m tests.benchmarks.bench_accounting

Drives ``Accounting.wrap`` around a handler that only fills the hooks the real request path
calls (``requested``, ``routing``/``routed``, ``attempted``), on an in-process bus with the
subscribers present or not, and prints microseconds per request — best of ``REPEATS`` runs,
in CPU time of this process, so a busy machine's noise stays out — for the metric updates
alone, and for the whole accounting (wrapper, hooks, metrics, ``RequestCompleted`` publish)
with ``events.decisions`` off and on.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from bus import InProcessBus
from gateway.ingress.accounting import Accounting, RequestRecord
from gateway.ingress.metrics import GatewayMetrics
from schemas import Observation, RequestCompleted, RouteCandidate, RoutePlan, RouteRequest, subjects

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest

N = 10_000
REPEATS = 7
ROUTE = RouteRequest(model="m", caller="ip:127.0.0.1", request_id="r1")
PLAN = RoutePlan(
    model="m",
    candidates=(
        RouteCandidate(endpoint="m:a", kind="openai_compat"),
        RouteCandidate(endpoint="m:b", kind="openai_compat"),
    ),
)


def _obs(attempt: int, outcome: str) -> Observation:
    return Observation(
        endpoint="m:a" if attempt == 1 else "m:b",
        model="m",
        outcome=outcome,
        attempt=attempt,
        latency_ms=12.0,
        ttft_ms=3.0,
        prompt_tokens=10,
        completion_tokens=5,
        request_id="r1",
        ts=time.time(),
    )


REQ = cast("HttpRequest", SimpleNamespace(scope={}, started=False))  # only its scope is read
ONE = [_obs(1, "success")]
TWO = [_obs(1, "failure"), _obs(2, "success")]


async def _handler(record: RequestRecord, attempts: list[Observation]) -> None:
    record.requested("m")
    record.routing(ROUTE)
    record.routed(PLAN)
    for obs in attempts:
        record.attempted(obs)


def _metrics_only(attempts: list[Observation]) -> float:
    m = GatewayMetrics()
    done = RequestCompleted(
        model="m",
        endpoint="m:b",
        latency_ms=12.0,
        ttft_ms=3.0,
        prompt_tokens=10,
        completion_tokens=5,
        fallback=len(attempts) > 1,
    )
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.process_time()
        for _ in range(N):
            m.request(done, attempts, 0.0003)
        best = min(best, time.process_time() - t0)
    return best / N * 1e6


async def _whole(attempts: list[Observation], *, decisions: bool, subscribed: bool) -> float:
    bus = InProcessBus()
    acc = Accounting(bus, GatewayMetrics(), decisions=decisions)

    async def handler(req: Any, record: RequestRecord) -> None:
        await _handler(record, attempts)

    wrapped = acc.wrap(handler, "chat")

    async def baseline(req: Any) -> None:
        await _handler(RequestRecord(), attempts)

    async with (
        bus.subscribe(subjects.REQUEST_DONE_ANY) as s1,
        bus.subscribe(subjects.EVENTS_ANY) as s2,
    ):
        if not subscribed:
            s1.close()
            s2.close()
        base = total = float("inf")
        for _ in range(REPEATS):
            t0 = time.process_time()
            for _ in range(N):
                await baseline(REQ)
            base = min(base, time.process_time() - t0)
            t0 = time.process_time()
            for _ in range(N):
                await wrapped(REQ)
            total = min(total, time.process_time() - t0)
            for sub in (s1, s2):  # drain outside the timed loop
                while sub.pending:
                    await anext(aiter(sub))
    await bus.aclose()
    return (total - base) / N * 1e6


async def main() -> None:
    """Print the measurements."""
    for name, attempts in (("1 attempt", ONE), ("2 attempts (fallback)", TWO)):
        print(f"{name}:")
        print(f"  metrics update only            {_metrics_only(attempts):6.2f} us/request")
        for decisions in (False, True):
            for subscribed in (False, True):
                us = await _whole(attempts, decisions=decisions, subscribed=subscribed)
                print(
                    f"  accounting, decisions={decisions!s:5} subscribers={subscribed!s:5}"
                    f" {us:6.2f} us/request"
                )


if __name__ == "__main__":
    asyncio.run(main())
