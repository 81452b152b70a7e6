"""EndpointActor: owns one endpoint's health and circuit, fed by observations."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from actors.base import Actor, ActorContext, Cancellable, Serve
from actors.state.backoff import ProbeBackoff, first_probe_after
from actors.state.circuit import CLOSED, HALF_OPEN, OPEN, EndpointHealth, Transition
from schemas import (
    AuthRejected,
    BenchChanged,
    CircuitTransition,
    EndpointState,
    ErrorCode,
    Observation,
    ProbeDue,
    ProbeFirstByte,
    ProbeGrant,
    ProbeRequest,
    ProbeResult,
    RouteCandidate,
    StateRequest,
    is_backpressure,
    subjects,
)
from schemas.config import BenchConfig, CircuitConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Tick:
    """Local timer message: re-evaluate time-driven transitions."""


@dataclass(frozen=True, slots=True)
class _BenchProbeDue:
    """Local timer message: a benched route is due its background probe."""


@dataclass(frozen=True, slots=True)
class _CircuitProbeDue:
    """Local timer message: a half-open circuit whose probe no request took is due its
    background probe."""


_BACKGROUND = "background-probe"  # the probe lease's owner when the prober holds it
_BACKGROUND_PROBE_SECONDS = 15.0  # the prober's own timeout (gateway/process/prober.py)


@dataclass(frozen=True, slots=True)
class _BenchOver:
    """Local timer message: a bench may have run out."""


class _Snapshot(msgspec.Struct):
    """The circuit and the bench as saved (times on the actor's clock, wall-clock seconds)."""

    state: str = CLOSED
    open_until: float | None = None
    consecutive_failures: int = 0
    benched_until: float | None = None
    floor_until: float | None = None
    bench_reason: str = ""
    target: str = ""  # where the route sent its attempts: kind, base URL, upstream model


class EndpointActor(Actor):
    """One per endpoint id. Serves probe leases and state; publishes every change.

    Publishes ``EndpointState`` on ``llmgw.endpoint.<id>.state`` and ``CircuitTransition`` /
    ``AuthRejected`` on ``llmgw.events.*``.
    """

    def __init__(
        self,
        endpoint: str,
        model: str,
        settings: CircuitConfig,
        *,
        bench: BenchConfig | None = None,
        candidate: RouteCandidate | None = None,
        probe_timeout: float | None = None,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = f"endpoint:{endpoint}"
        self.endpoint = endpoint
        self.model = model
        self.serves = (
            Serve(subjects.observation(endpoint)),
            Serve(subjects.endpoint_probe(endpoint)),
            Serve(subjects.endpoint_get(endpoint)),
            Serve(subjects.endpoint_probe_result(endpoint)),
        )
        self._settings = settings
        self._bench = bench or BenchConfig()
        self._candidate = candidate
        self._target = (
            f"{candidate.kind} {candidate.base_url} {candidate.upstream_model}".strip()
            if candidate is not None
            else ""
        )
        # The half-open probe's deadline: the route's own timeout, by which the ingress gives
        # its verdict, plus one cooldown of grace so that verdict arrives first (without a
        # route timeout: one cooldown).
        self._probe_timeout = (probe_timeout or 0.0) + settings.cooldown_seconds
        self._clock = clock
        self._snapshots = snapshots
        self._seq = 0
        self._probes: ProbeBackoff | None = None  # while benched: when its next probe is due
        self._probe_timer: Cancellable | None = None

    async def on_start(self, ctx: ActorContext) -> None:
        """Start closed and healthy, or as the last snapshot left it, and say so."""
        self.ctx = ctx
        self.health = EndpointHealth(self._settings, self._bench)
        self._bench_reason = ""  # why the route is benched, while it is (published in state)
        self._saved = self.health.durable()
        await self._restore()
        await self._publish_state()

    async def on_stop(self) -> None:
        """Persist the circuit and the bench (they are saved on every change anyway)."""
        await self._save()

    async def _restore(self) -> None:
        """A restart keeps an open circuit open and a bench benched for what remains."""
        if self._snapshots is None:
            return
        snap = await self._snapshots.load_as(self.name, _Snapshot)
        if snap is None:
            return
        if snap.target and snap.target != self._target:
            # A reload pointed the route elsewhere under the same id (an anthropic route's
            # base_url, an upstream model): what was learned of the old upstream would keep
            # the new one benched (up to 10 min) or open for nothing it did.
            logger.info(
                "endpoint %s now reaches %s (was %s): its circuit and bench start afresh",
                self.endpoint,
                self._target,
                snap.target,
            )
            await self._save()
            return
        now = self._clock()
        h = self.health
        h.restore(
            snap.state,
            snap.open_until,
            snap.consecutive_failures,
            snap.benched_until,
            snap.floor_until,
            now,
        )
        self._bench_reason = snap.bench_reason if h.benched_until is not None else ""
        self._saved = h.durable()
        if h.state == OPEN and h.open_until is not None:
            self.ctx.call_later(max(0.0, h.open_until - now), _Tick())
        elif h.state == HALF_OPEN:  # its probe, if no request takes it
            self.ctx.call_later(self._settings.cooldown_seconds, _CircuitProbeDue())
        if h.benched_until is not None:
            self._start_bench_probes(now, h.benched_until)
            self.ctx.call_later(h.benched_until - now, _BenchOver())
        if h.state != CLOSED or h.benched_until is not None:
            logger.info(
                "endpoint %s restored: circuit %s, benched until %s",
                self.endpoint,
                h.state,
                h.benched_until,
            )

    async def _save(self) -> None:
        if self._snapshots is None:
            return
        durable = self.health.durable()
        state, open_until, failures, benched_until, floor_until = durable
        snap = _Snapshot(
            state=state,
            open_until=open_until,
            consecutive_failures=failures,
            benched_until=benched_until,
            floor_until=floor_until,
            bench_reason=self._bench_reason,
            target=self._target,
        )
        await self._snapshots.save(self.name, msgspec.json.encode(snap), self._clock())
        self._saved = durable

    async def handle(self, env: Envelope) -> None:
        """Observations update health; ProbeRequest leases the probe; StateRequest reads."""
        match env.message:
            case Observation() as obs:
                await self._observe(obs)
            case ProbeRequest() as ask:
                await env.respond(await self._grant_probe(ask.request_id))
            case StateRequest():
                await env.respond(self.state())
            case ProbeResult() as result:
                await self._probe_result(result)
            case ProbeFirstByte() as first:
                await self._probe_first_byte(first)

    async def handle_local(self, msg: object) -> None:
        """Timers: an elapsed cooldown, an overdue probe, a bench's probe or its end."""
        if isinstance(msg, _Tick):
            await self._after(self.health.tick(self._clock()))
        elif isinstance(msg, _BenchProbeDue):
            self._probe_timer = None
            now = self._clock()
            if self.health.benched(now) and self._candidate is not None:
                await self.ctx.publish(
                    subjects.PROBE_DUE,
                    ProbeDue(endpoint=self.endpoint, model=self.model, candidate=self._candidate),
                )
                self._schedule_bench_probe(now)
        elif isinstance(msg, _CircuitProbeDue):
            await self._circuit_probe()
        elif isinstance(msg, _BenchOver):
            now = self._clock()
            until = self.health.benched_until
            if until is not None and now >= until:
                self.health.lift_bench()
                await self._bench_changed(False, "bench ran out", now)
            elif until is not None:
                self.ctx.call_later(until - now, _BenchOver())

    async def _circuit_probe(self) -> None:
        """A half-open circuit whose probe no request took within a cooldown (every caller
        pinned to another route, or a route the draw seldom lands on) is probed in the
        background, as a bench is: else it stays half-open, out of rotation, for as long as
        that lasts."""
        now = self._clock()
        h = self.health
        await self._after(h.tick(now))
        if self._candidate is None:
            return
        if h.benched(now):  # its own probes first; the circuit's turn comes after the bench
            self.ctx.call_later(self._settings.cooldown_seconds, _CircuitProbeDue())
            return
        # Its answer is due within the prober's timeout; a lost one frees the lease a
        # cooldown later (the circuit opens again, and the next half-open tries again).
        timeout = _BACKGROUND_PROBE_SECONDS + self._settings.cooldown_seconds
        if not h.try_acquire_probe(now, timeout, _BACKGROUND):
            return  # a request holds the probe, or the circuit is no longer half-open
        self.ctx.call_later(timeout, _Tick())
        await self._publish_state()
        await self.ctx.publish(
            subjects.PROBE_DUE,
            ProbeDue(endpoint=self.endpoint, model=self.model, candidate=self._candidate),
        )

    async def _probe_result(self, result: ProbeResult) -> None:
        """Any probe that got an answer from this route (its own, a muted credential's, an
        admin's lift) ends the bench; only the route's own failed probe re-benches it. The
        route's own probe of a half-open circuit closes it, or re-opens it."""
        now = self._clock()
        h = self.health
        if not h.benched(now):
            if h.state == HALF_OPEN and h.probe_owner == _BACKGROUND and h.probe_in_flight:
                if result.ok:
                    await self._after(h.record_success(now, probe=True))
                elif not result.credential_only:
                    await self._after(h.record_failure(now, probe=True))
            return
        if result.ok:
            if self.health.probe_succeeded(now):
                await self._bench_changed(False, "background probe succeeded", now)
            elif (until := self.health.benched_until) is not None:
                # The provider's Retry-After still holds it: the bench ends there instead.
                self.ctx.call_later(until - now, _BenchOver())
                await self._publish_state()
        elif not result.credential_only:
            self.health.rebench(now)
            await self._bench_changed(True, f"background probe failed: {result.detail}", now)

    async def _bench_changed(
        self, benched: bool, reason: str, now: float, *, started: bool = False
    ) -> None:
        log = logger.warning if benched else logger.info
        log("route %s %s (%s)", self.endpoint, "benched" if benched else "back", reason)
        until = self.health.benched_until
        self._bench_reason = reason if benched else ""
        if benched and until is not None:
            if started:
                self._start_bench_probes(now, until)
            else:
                self._schedule_bench_probe(now)
            # The bench's own end is checked when it is due (and again if it was extended).
            self.ctx.call_later(until - now, _BenchOver())
        elif not benched:
            self._stop_bench_probes()
        # The state before the event: whoever acts on the event finds the views updated.
        await self._publish_state()
        await self.ctx.publish(
            subjects.event("bench"),
            BenchChanged(
                endpoint=self.endpoint,
                model=self.model,
                benched=benched,
                until=until,
                reason=reason,
                ts=now,
            ),
        )

    def _start_bench_probes(self, now: float, until: float) -> None:
        """Re-validate a new bench first after the circuit cooldown, then with backoff (at
        most ``probe_max_interval_seconds`` apart)."""
        self._stop_bench_probes()
        self._probes = ProbeBackoff(
            first_probe_after(
                self._settings.cooldown_seconds, self._bench.probe_after_fraction, until - now
            ),
            self._bench.probe_max_interval_seconds,
        )
        self._schedule_bench_probe(now)

    def _schedule_bench_probe(self, now: float) -> None:
        if self._probe_timer is not None or self._probes is None:
            return  # the next probe is already due (or nothing is benched)
        delay = self._probes.next_delay(now, self.health.benched_until)
        if delay is not None:
            self._probe_timer = self.ctx.call_later(delay, _BenchProbeDue())

    def _stop_bench_probes(self) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        self._probe_timer = None
        self._probes = None

    def state(self) -> EndpointState:
        """This endpoint's state as views see it."""
        h = self.health
        return EndpointState(
            endpoint=self.endpoint,
            model=self.model,
            circuit_state=h.state,
            availability=round(h.availability, 6),
            consecutive_failures=h.consecutive_failures,
            consecutive_auth_rejections=h.consecutive_auth_rejections,
            open_until=h.open_until,
            probe_in_flight=h.probe_in_flight,
            seq=self._seq,
            benched_until=h.benched_until,
            bench_reason=self._bench_reason if h.benched_until is not None else "",
        )

    async def _probe_first_byte(self, first: ProbeFirstByte) -> None:
        h = self.health
        if h.is_late_probe(first.request_id):
            await self._after(h.record_success(self._clock(), probe=False, owner=first.request_id))
            return
        if h.state != HALF_OPEN or not h.probe_in_flight or h.is_stale_probe(first.request_id):
            return
        await self._after(h.record_success(self._clock(), probe=True))

    async def _grant_probe(self, request_id: str = "") -> ProbeGrant:
        now = self._clock()
        await self._after(self.health.tick(now))
        # A probe with no verdict within the route's own timeout counts as hung (a stream's
        # verdict is its first byte, ProbeFirstByte, so a long healthy stream is not cut short).
        timeout = self._probe_timeout
        if self.health.try_acquire_probe(now, timeout, request_id):
            self.ctx.call_later(timeout, _Tick())
            await self._publish_state()
            return ProbeGrant(granted=True)
        return ProbeGrant(granted=False, retry_after=self.health.retry_after(now) or None)

    async def _observe(self, obs: Observation) -> None:
        now = self._clock()
        h = self.health
        before = (h.availability, h.consecutive_failures, h.probe_in_flight)
        transition: Transition | None = None
        # A probe that timed out and was replaced reports as an ordinary attempt.
        probe = obs.probe and not h.is_stale_probe(obs.request_id)
        backpressure = is_backpressure(obs)
        if backpressure and not probe:
            # A rate limit says "slower", not "sick": the key pool cools the credential;
            # the circuit, the bench and the availability leave it alone.
            return
        answered = obs.outcome == "client_error" or backpressure
        if obs.outcome == "success" or (answered and probe):
            # A 4xx on a probe (a 429 included) still proves the endpoint answers.
            transition = h.record_success(
                now, probe=probe, owner=obs.request_id if obs.probe else ""
            )
        elif obs.outcome == "failure":
            transition = h.record_failure(now, probe=probe, auth=obs.auth_rejection)
            if obs.auth_rejection:
                await self._auth_rejected(obs, now)
            was_benched = h.benched_until
            # A key-pool refusal sent nothing upstream: the keys' mutes cover it, and it says
            # nothing about the model (counting it would bench a route for a muted key).
            sent = obs.error_kind != ErrorCode.KEY_POOL_EXHAUSTED.value
            if sent and h.note_retryable_failure(now, obs.retry_after):
                await self._bench_changed(
                    True,
                    f"{self._bench.failures} failures within {self._bench.window_seconds:g} s",
                    now,
                    started=True,
                )
            elif h.benched_until != was_benched:
                await self._publish_state()
        elif obs.outcome == "cancelled" and probe:
            transition = h.record_abandoned_probe(now, "probe abandoned by its client")
        if transition is not None:
            await self._after(transition)
        elif before != (h.availability, h.consecutive_failures, h.probe_in_flight):
            await self._publish_state()

    async def _auth_rejected(self, obs: Observation, now: float) -> None:
        n = self.health.consecutive_auth_rejections
        logger.warning(
            "upstream rejected our credential: endpoint=%s status=%s credential=%s consecutive=%d",
            self.endpoint,
            obs.status,
            obs.credential_id or "-",
            n,
        )
        await self.ctx.publish(
            subjects.event("auth_rejected"),
            AuthRejected(
                endpoint=self.endpoint,
                model=self.model,
                status=obs.status or 0,
                consecutive=n,
                credential_id=obs.credential_id,
                ts=now,
            ),
        )

    async def _after(self, transition: Transition | None) -> None:
        if transition is None:
            return
        if transition.new == OPEN:
            self.ctx.call_later(self._settings.cooldown_seconds, _Tick())
        elif transition.new == HALF_OPEN:
            # Live traffic gets the first chance at the probe (passive health costs nothing).
            self.ctx.call_later(self._settings.cooldown_seconds, _CircuitProbeDue())
        log = logger.warning if transition.new == OPEN else logger.info
        log(
            "circuit %s -> %s: endpoint=%s (%s)",
            transition.old,
            transition.new,
            self.endpoint,
            transition.reason,
        )
        # State first: whoever reacts to the event finds the views already updated.
        await self._publish_state()
        await self.ctx.publish(
            subjects.event("circuit"),
            CircuitTransition(
                endpoint=self.endpoint,
                model=self.model,
                old=transition.old,
                new=transition.new,
                reason=transition.reason,
                ts=self._clock(),
            ),
        )

    async def _publish_state(self) -> None:
        # Views first, the write after: routing must not wait on the disk to see a bench.
        self._seq += 1
        await self.ctx.publish(subjects.endpoint_state(self.endpoint), self.state())
        h = self.health
        if (h.state, h.open_until, h.benched_until, h.floor_until) != (
            self._saved[0],
            self._saved[1],
            self._saved[3],
            self._saved[4],
        ):
            await self._save()  # only a circuit or bench change costs a write, never a streak
