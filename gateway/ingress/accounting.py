"""Per-request accounting at the ingress: metrics, the request summary, the decision event, and
the request log's rows kept until the store commits them.

:meth:`Accounting.wrap` wraps an inference handler: it opens a :class:`RequestRecord` for
the request and passes it to the handler, which carries it along (on its ``RequestInfo``) to
where its one-line hooks are called — :meth:`~RequestRecord.requested` (the model name the
client asked for), :meth:`~RequestRecord.routing` / :meth:`~RequestRecord.routed` (the
RouteRequest and the plan, timing the decision's bus round trip),
:meth:`~RequestRecord.steered` and :meth:`~RequestRecord.attempted` (each attempt's
Observation). When the handler ends, however it ends, the wrapper updates the metrics,
hands ``RequestCompleted`` and the attempts to the request log's outbox
(:class:`LogOutbox`, below: kept until the store acknowledges them committed), publishes
``RequestCompleted`` and, when ``events.decisions`` is on, ``RouteDecided`` on
``llmgw.events.decision``. A record nobody wrapped (explain's) is filled and dropped.

Cost: one record allocation, the metric updates (measured a few microseconds), and one or two
bus publishes (about 3 µs each in-process; fire-and-forget on NATS). Publishing never waits
for a subscriber, and a failed publish is logged, never raised.

The request log's outbox (:class:`LogOutbox`): rows kept until their owner says they are
committed.

Each client request that ends leaves one ``RequestCompleted`` and its attempts'
``Observation``s here (:meth:`LogOutbox.add`: no await, nothing on the request's path). One
task sends them to the StoreActor as ``LogAppend`` batches on ``llmgw.log.append``, one batch
in flight at a time: what ends while a batch waits for its answer forms the next one, so the
batches grow with the load (at most ``log.batch_rows`` rows, and :data:`BATCH_ROWS_MAX`). The
store answers only once the batch is committed; until then the batch stays here and is sent
again (same ``sender`` and ``seq``, so the store commits it once) every :data:`RETRY_S` while
no owner answers, or after ``flush_ms`` + :data:`ACK_GRACE_S` without an answer: a store that
crashed or is restarting (a kill -9 of the actors process) loses none of it.

Bounded: at most ``log.queue_rows`` rows wait here; past that a new request's rows are
dropped, counted (:attr:`LogOutbox.dropped`) and logged. A clean stop sends what is left
before the bus closes (for at most :data:`CLOSE_WAIT_S`); an ingress killed with rows still
unacknowledged loses those (at most its last ``flush_ms`` or so of traffic). Once the bus is
closed (a ``--workers`` worker whose supervisor died took its private nats-server and the store
with it) nothing is sent or kept for later: the stop logs the rows lost. A row no bus can carry
is dropped once a send fails, not sent again for ever (``log_rows``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from gateway.auth.admin_access import CALLER_SCOPE_KEY
from gateway.http.errors import error_code, http_status
from gateway.http.request import bounded
from gateway.ingress import log_rows
from gateway.ingress.surfaces import MESSAGES
from schemas import (
    GatewayError,
    LogAppend,
    LogAppended,
    RequestCompleted,
    RouteDecided,
    raise_for_reply,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bus import Bus
    from gateway.http.request import HttpRequest
    from gateway.ingress.metrics import GatewayMetrics
    from gateway.steering.resolver import Resolution
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.request_trace import RequestTrace
    from schemas import Message, Observation, RoutePlan, RouteRequest
    from schemas.config import LogConfig

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
                overload = surface == MESSAGES.name  # as the client was answered
                status = 200 if req.started else http_status(err, relays_overload=overload)
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
        # Every attempt's priced tokens, as cost_usd sums every attempt's (a failed-over or
        # hedged one was billed too); schemas.priced_tokens inlined, off the call path.
        prompt = completion = cached = 0
        for a in attempts:
            est = a.cost_estimated  # a stream's start may have reported the prompt
            p = (a.prompt_tokens or a.prompt_estimate) if est else a.prompt_tokens
            prompt += p
            completion += max(0, a.billed_tokens - p) if est else a.completion_tokens
            cached += a.cached_tokens
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
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
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


# ---------------------------------------------------------------------------- request-log outbox

BATCH_ROWS_MAX = 512
"""The most rows one ``LogAppend`` carries (well under NATS's 1 MB message limit)."""
RETRY_S = 0.5
"""How long a batch no owner answered waits before it is sent again."""
ACK_GRACE_S = 5.0
"""How long past ``flush_ms`` the store may take to answer a batch before it is sent again."""
CLOSE_WAIT_S = 5.0
"""How long a clean stop waits for the rows still here to be acknowledged."""


class LogOutbox:
    """Owns this ingress's unacknowledged request-log rows and the task sending them."""

    def __init__(self, bus: Bus, settings: LogConfig) -> None:
        self._bus = bus
        self._settings = settings
        # Unique per process lifetime: a restarted ingress (pid 1 in a container again)
        # must never look like the old one, whose seqs the store already committed.
        self.sender = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._queue: deque[tuple[RequestCompleted, Sequence[Observation]]] = deque()
        self._queued_rows = 0
        self._batch: LogAppend | None = None  # sent, not yet acknowledged
        self._seq = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.dropped = 0
        self._drops = 0
        self.failures = 0  # sends not acknowledged since the last acknowledged one

    def reconfigure(self, settings: LogConfig) -> None:
        """Use ``settings`` (a reloaded ``log:`` section) from the next batch on."""
        self._settings = settings

    @property
    def waiting(self) -> int:
        """Rows here not yet acknowledged as committed (queued and in flight)."""
        batch = self._batch
        in_flight = len(batch.requests) + len(batch.attempts) if batch is not None else 0
        return self._queued_rows + in_flight

    def add(self, done: RequestCompleted, attempts: Sequence[Observation]) -> None:
        """Keep one request's rows for the store; never blocks, never raises."""
        rows = 1 + len(attempts)
        if self.waiting + rows > self._settings.queue_rows:
            self.dropped += rows
            self._drops += 1
            if self._drops & (self._drops - 1) == 0:  # 1, 2, 4, ...: not once per request
                logger.error(
                    "request log: %d rows wait for the store (log.queue_rows); "
                    "%d rows dropped so far",
                    self.waiting,
                    self.dropped,
                )
            return
        self._queue.append((done, attempts))
        self._queued_rows += rows
        self._drained.clear()
        self._wake.set()

    async def drained(self) -> None:
        """Return once no row is kept here (every one acknowledged, or none added)."""
        await self._drained.wait()

    def start(self) -> None:
        """Start the sending task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="log-outbox")

    async def aclose(self, wait: float = CLOSE_WAIT_S) -> None:
        """Send what is left (for at most ``wait`` seconds, not past the first send the store
        does not acknowledge, and not at all once the bus is closed), then stop; rows still
        here are logged as lost."""
        task, self._task = self._task, None
        if task is None:
            return
        self._closing = True
        self._wake.set()
        await asyncio.wait({task}, timeout=wait)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if not self.waiting:
            return
        logger.error("%s", log_rows.lost_at_stop(self.waiting, unsent=self._queued_rows))

    async def _run(self) -> None:
        while True:
            if self._batch is None:
                if not self._queue:
                    self._drained.set()
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self._bus.closed:
                    return  # nothing reaches a store any more: aclose counts the rows lost
                self._batch = self._next_batch()
            if await self._send(self._batch):
                self._batch = None
            elif (kept := self._carried(self._batch)) is not self._batch:
                self._batch = kept  # what a bus can carry of it goes at once
            elif self._closing or self._bus.closed:
                return  # stopping, or the bus is gone: no store takes the rows now
            else:
                await asyncio.sleep(RETRY_S)

    def _next_batch(self) -> LogAppend:
        requests: list[RequestCompleted] = []
        attempts: list[Observation] = []
        rows = 0
        cap = min(self._settings.batch_rows, BATCH_ROWS_MAX)
        while self._queue:
            done, tried = self._queue[0]
            if requests and rows + 1 + len(tried) > cap:
                break
            self._queue.popleft()
            requests.append(done)
            attempts.extend(tried)
            rows += 1 + len(tried)
        self._queued_rows -= rows
        self._seq += 1
        return LogAppend(
            sender=self.sender, seq=self._seq, requests=tuple(requests), attempts=tuple(attempts)
        )

    def _carried(self, batch: LogAppend) -> LogAppend | None:
        kept, left_out = log_rows.carried(batch)
        if left_out:
            self.dropped += left_out
            logger.error("request log: %d rows dropped: no bus message can carry them", left_out)
        return kept

    async def _send(self, batch: LogAppend) -> bool:
        """True once the store acknowledged ``batch`` (committed now or before)."""
        timeout = self._settings.flush_ms / 1000 + ACK_GRACE_S
        try:
            raise_for_reply(
                await self._bus.request(
                    subjects.LOG_APPEND, batch, reply_type=LogAppended, timeout=timeout
                )
            )
        except Exception as exc:  # kept and sent again: the outbox must outlive any failure
            if self._bus.closed:
                return False  # not kept for later: no later comes (aclose counts them)
            if not isinstance(exc, GatewayError):
                logger.exception("request log: sending a batch failed")
            self.failures += 1
            if self.failures & (self.failures - 1) == 0:  # 1, 2, 4, ...: not every retry
                logger.warning(
                    "request log: %d rows kept for the store until it answers (%s)",
                    self.waiting,
                    exc.message if isinstance(exc, GatewayError) else type(exc).__name__,
                )
            return False
        if self.failures:
            logger.info("request log: the store answers again; delivering the kept rows")
            self.failures = 0
        return True
