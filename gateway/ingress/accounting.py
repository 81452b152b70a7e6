"""Per-request accounting at the ingress: metrics, the request summary, the decision event.

:meth:`Accounting.wrap` wraps an inference handler: it opens a :class:`RequestRecord` for
the request and passes it to the handler, which carries it along (on its ``RequestInfo``) to
where its one-line hooks are called — :meth:`~RequestRecord.requested` (the model name the
client asked for), :meth:`~RequestRecord.routing` / :meth:`~RequestRecord.routed` (the
RouteRequest and the plan, timing the decision's bus round trip),
:meth:`~RequestRecord.steered` and :meth:`~RequestRecord.attempted` (each attempt's
Observation). When the handler ends, however it ends, the wrapper updates the metrics,
hands ``RequestCompleted`` and the attempts to the request log's outbox
(``gateway.ingress.log_outbox``: kept until the store acknowledges them committed), publishes
``RequestCompleted`` and, when ``events.decisions`` is on, ``RouteDecided`` on
``llmgw.events.decision``. A record nobody wrapped (explain's) is filled and dropped.

Cost: one record allocation, the metric updates (measured a few microseconds), and one or two
bus publishes (about 3 µs each in-process; fire-and-forget on NATS). Publishing never waits
for a subscriber, and a failed publish is logged, never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from gateway.auth.admin_access import CALLER_SCOPE_KEY
from gateway.http.errors import error_code, http_status
from gateway.http.request import bounded
from schemas import GatewayError, RequestCompleted, RouteDecided, subjects

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest
    from gateway.ingress.log_outbox import LogOutbox
    from gateway.ingress.metrics import GatewayMetrics
    from gateway.steering.resolver import Resolution
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.request_trace import RequestTrace
    from schemas import Message, Observation, RoutePlan, RouteRequest

logger = logging.getLogger(__name__)

Handler = Callable[["HttpRequest"], Awaitable[None]]
AccountedHandler = Callable[["HttpRequest", "RequestRecord"], Awaitable[None]]
CLIENT_CLOSED = 499  # the client went away before the answer ended (nginx's convention)
_DECISION = subjects.event("decision")


@dataclass(slots=True)
class RequestRecord:
    """What one request's hooks noted; owned by that request, passed along explicitly."""

    started: float = field(default_factory=time.perf_counter)
    wall: float = field(default_factory=time.time)
    requested_model: str = ""
    route: RouteRequest | None = None
    plan: RoutePlan | None = None
    asked: float = 0.0
    decision_s: float | None = None
    attempts: list[Observation] = field(default_factory=list)
    resolution: Resolution | None = None
    trace: RequestTrace | None = None
    """The request's spans when telemetry is on (gateway.telemetry)."""
    in_flight: list[tuple[float, float]] = field(default_factory=list)
    """When each upstream attempt was in flight (a stream's: to its first chunk, then whole)."""

    def requested(self, name: str) -> None:
        """Note the model name the client asked for (the first one noted wins), bounded."""
        if not self.requested_model:
            self.requested_model = bounded(name)

    def routing(self, route: RouteRequest) -> None:
        """Note the RouteRequest about to be sent to the model's owner."""
        self.route = route
        self.asked = time.perf_counter()
        if self.trace is not None:
            self.trace.routing(route)

    def routed(self, plan: RoutePlan) -> RoutePlan:
        """Note the plan the owner answered (returns it, to wrap a ``return``)."""
        self.plan = plan
        self.decision_s = time.perf_counter() - self.asked
        if self.trace is not None:
            self.trace.routed(plan, self.resolution)
        return plan

    def upstream(self, began: float, ended: float) -> None:
        """Note that an upstream attempt was in flight from ``began`` to ``ended`` (seconds,
        one monotonic clock)."""
        self.in_flight.append((began, ended))

    @property
    def upstream_s(self) -> float:
        """Seconds some upstream attempt was in flight: overlapping attempts (a hedge race, a
        stream noted at its first chunk and at its end) count once."""
        total, until = 0.0, float("-inf")
        for began, ended in sorted(self.in_flight):
            start = max(began, until)
            if ended > start:
                total += ended - start
            until = max(until, ended)
        return total

    def overhead_header(self, now: float | None = None) -> tuple[bytes, bytes]:
        """``x-llmgw-overhead-ms``: the time until ``now`` (default: the present, on
        ``started``'s clock) not spent waiting for an upstream."""
        own = (time.perf_counter() if now is None else now) - self.started - self.upstream_s
        return (b"x-llmgw-overhead-ms", b"%.3f" % max(0.0, own * 1000))

    def steered(self, res: Resolution) -> None:
        """Note how a steered request's target was resolved (for the decision event)."""
        self.resolution = res

    def attempted(self, obs: Observation, began: float | None = None) -> None:
        """Note one attempt's Observation; with ``began`` (seconds, the clock of
        :meth:`upstream`), that it was in flight from then for its latency."""
        self.attempts.append(obs)
        if began is not None:
            self.in_flight.append((began, began + obs.latency_ms / 1000))


def _steering_brief(res: Resolution | None) -> dict[str, Any]:
    """The decision event's compact account of a steered request."""
    if res is None:
        return {}
    chosen, score, runner_up, runner_up_score = res.brief()
    return {
        "target": res.target,
        "chain": res.chain or "",
        "axis": res.axis or "",
        "ordering": res.ordering.how,
        "chosen": chosen,
        "score": score,
        "runner_up": runner_up,
        "runner_up_score": runner_up_score,
        "explored": res.explored,
        "rule": res.rule,
    }


class Accounting:
    """Owns the per-request accounting of one ingress (see the module docstring)."""

    def __init__(
        self,
        bus: Bus,
        metrics: GatewayMetrics,
        *,
        decisions: bool,
        telemetry: Telemetry | None = None,
        outbox: LogOutbox | None = None,
    ) -> None:
        self._bus = bus
        self.metrics = metrics
        self.decisions = decisions
        self.telemetry = telemetry
        self.outbox = outbox  # None: no request log (``log.enabled: false``)
        self._done_subjects: dict[str, str] = {}  # model -> subject; escaping costs ~1 µs

    def wrap(self, handler: AccountedHandler, surface: str) -> Handler:
        """``handler`` with accounting: it gets the request's fresh record, and raises what
        ``handler`` raises."""

        async def accounted(req: HttpRequest) -> None:
            rec = RequestRecord()
            if self.telemetry is not None:  # an inference route's path is its own template
                rec.trace = self.telemetry.request(req, req.path)
            try:
                await handler(req, rec)
            except GatewayError as err:
                # Once the answer started, the client saw 200 whatever failed afterwards.
                status = 200 if req.started else http_status(err)
                await self._finish(req, rec, surface, status, error_code(err))
                raise
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await self._finish(req, rec, surface, CLIENT_CLOSED, "cancelled")
                raise
            except Exception:
                await self._finish(req, rec, surface, 500, "internal")
                raise
            else:
                await self._finish(req, rec, surface, 200, "")

        return accounted

    async def _finish(
        self, req: HttpRequest, rec: RequestRecord, surface: str, status: int, kind: str
    ) -> None:
        attempts = rec.attempts
        # A hedge's loser is cancelled once the backup answers, and may be noted after it:
        # the attempt that answered is the request's outcome, whatever came last.
        last = next(
            (a for a in reversed(attempts) if a.outcome == "success"),
            attempts[-1] if attempts else None,
        )
        if last is not None and not kind and last.outcome != "success":
            # The handler returned, yet the last attempt did not succeed: the client left
            # (cancelled), or a committed stream broke (headers already said 200).
            status, kind = (
                (CLIENT_CLOSED, "cancelled")
                if last.outcome == "cancelled"
                else (status, last.error_kind or "stream_broken")
            )
        route = rec.route
        caller = req.scope.get(CALLER_SCOPE_KEY)
        served = last.endpoint if last is not None and last.outcome == "success" else ""
        ttft = None
        if last is not None and last.ttft_ms is not None:
            began = last.ts - last.latency_ms / 1000  # the attempt's start, wall clock
            ttft = (began - rec.wall) * 1000 + last.ttft_ms
        done = RequestCompleted(
            request_id=req.request_id,
            ts=time.time(),
            caller=route.caller if route else "",
            org=str(getattr(caller, "org", "") or ""),
            key_id=str(getattr(caller, "key_id", "") or ""),
            user=str(getattr(caller, "user", "") or ""),
            surface=route.surface if route else surface,
            requested_model=rec.requested_model,
            model=route.model if route else "",
            endpoint=last.endpoint if last is not None else "",
            credential_id=last.credential_id if last is not None else "",
            status=status,
            error_kind=kind,
            fallback=len(attempts) > 1,
            attempts=len(attempts),
            ttft_ms=ttft,
            latency_ms=(time.perf_counter() - rec.started) * 1000,
            prompt_tokens=last.prompt_tokens if last is not None else 0,
            completion_tokens=last.completion_tokens if last is not None else 0,
            cached_tokens=last.cached_tokens if last is not None else 0,
            stream=last.stream if last is not None else False,
            cost_usd=sum(a.cost_usd for a in attempts),
            cost_estimated=any(a.cost_estimated for a in attempts),
            trace_id=rec.trace.trace_id if rec.trace is not None else "",
        )
        if rec.trace is not None:
            rec.trace.finish(status, kind)
        try:
            self.metrics.request(done, attempts, rec.decision_s)
        except Exception:  # metrics must never fail a request
            logger.exception("metrics update failed")
        if self.outbox is not None:
            self.outbox.add(done, attempts)
        subject = self._done_subjects.get(done.model)
        if subject is None:
            if len(self._done_subjects) > 4096:  # models come and go with reloads
                self._done_subjects.clear()
            subject = self._done_subjects[done.model] = subjects.request_done(done.model)
        await self._publish(subject, done)
        if self.decisions and route is not None:
            plan = rec.plan
            await self._publish(
                _DECISION,
                RouteDecided(
                    request_id=done.request_id,
                    model=done.model,
                    requested_model=rec.requested_model,
                    surface=done.surface,
                    reason=plan.reason if plan else kind,
                    pinned=plan.pinned if plan else False,
                    primary=plan.candidates[0].endpoint if plan and plan.candidates else "",
                    candidates=tuple(c.endpoint for c in plan.candidates) if plan else (),
                    served=served,
                    fallback=done.fallback,
                    attempts=done.attempts,
                    status=status,
                    ts=done.ts,
                    skipped=plan.skipped if plan else (),
                    trace_id=done.trace_id,
                    **_steering_brief(rec.resolution),
                ),
            )

    async def _publish(self, subject: str, msg: Message) -> None:
        try:
            await self._bus.publish(subject, msg)
        except GatewayError as exc:
            logger.warning("accounting: %s not published: %s", type(msg).__name__, exc)
