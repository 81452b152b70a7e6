"""An endpoint's health: the availability EWMA and the circuit breaker (pure state, no I/O).

Spec: the breaker opens after ``failure_threshold`` consecutive failures, stays open for
``cooldown_seconds``, then admits exactly one half-open probe; a success closes it, a failure
re-opens it. A probe that hangs past its deadline, or is abandoned by its client, re-opens the
circuit for another cooldown so the endpoint is never wedged in half-open. The probe's
deadline is the route's own timeout (a slow model's probe must be allowed to answer), and a
success that the timed-out probe's holder reports late still closes the circuit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from schemas.config import BenchConfig, CircuitConfig

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Transition:
    """A circuit state change and why it happened."""

    old: str
    new: str
    reason: str


class EndpointHealth:
    """Owns one endpoint's availability, failure streaks and circuit state.

    Every method takes ``now`` (seconds on the caller's clock) and returns the Transition it
    caused, or None.
    """

    def __init__(self, settings: CircuitConfig, bench: BenchConfig | None = None) -> None:
        self.settings = settings
        self.bench = bench or BenchConfig()
        self.benched_until: float | None = None
        self.floor_until: float | None = None  # the provider's latest Retry-After, absolute
        self._recent_failures: deque[float] = deque()
        self.availability = 1.0
        self.consecutive_failures = 0
        self.consecutive_auth_rejections = 0
        self.state = CLOSED
        self.open_until: float | None = None
        self.probe_deadline: float | None = None
        self.probe_owner = ""  # the request id holding the probe lease ("" when unknown)
        self.timed_out_probe = ""  # the holder of the last probe that passed its deadline

    @property
    def probe_in_flight(self) -> bool:
        """True while the single half-open probe is out."""
        return self.probe_deadline is not None

    def is_stale_probe(self, request_id: str) -> bool:
        """Whether an attempt sent as a probe is not the probe now out: one that timed out
        and was replaced must not decide the circuit for its successor."""
        return (
            self.probe_in_flight
            and bool(self.probe_owner)
            and bool(request_id)
            and request_id != self.probe_owner
        )

    def is_late_probe(self, request_id: str) -> bool:
        """Whether ``request_id`` held the probe that timed out while the circuit is still
        not closed: its late success proves the endpoint answers."""
        return bool(request_id) and request_id == self.timed_out_probe and self.state != CLOSED

    def durable(self) -> tuple[str, float | None, int, float | None, float | None]:
        """What must outlive a restart: (state, open_until, consecutive_failures,
        benched_until, floor_until). A probe in flight is not: its holder reports to the
        next instance as an ordinary attempt, or not at all."""
        return (
            self.state,
            self.open_until,
            self.consecutive_failures,
            self.benched_until,
            self.floor_until,
        )

    def restore(
        self,
        state: str,
        open_until: float | None,
        consecutive_failures: int,
        benched_until: float | None,
        floor_until: float | None,
        now: float,
    ) -> None:
        """Take back what :meth:`durable` returned (times on the same clock); a bench that
        ran out meanwhile is gone, an elapsed cooldown half-opens on the next tick."""
        self.state = state if state in (CLOSED, OPEN, HALF_OPEN) else CLOSED
        self.open_until = open_until if self.state == OPEN else None
        if self.state == OPEN and self.open_until is None:
            self.open_until = now  # an unreadable cooldown: half-open on the next tick
        self.consecutive_failures = consecutive_failures
        if benched_until is not None and benched_until > now:
            self.benched_until = benched_until
            self.floor_until = floor_until

    def benched(self, now: float) -> bool:
        """Whether the model bench holds this endpoint out of rotation at ``now``."""
        return self.benched_until is not None and now < self.benched_until

    def note_retryable_failure(self, now: float, retry_after: float | None = None) -> bool:
        """Count a retryable failure in the sliding window; True when it starts a bench.

        A provider ``Retry-After`` is a floor on the bench: it can lengthen one, never
        shorten one already running.
        """
        window = self._recent_failures
        window.append(now)
        while window and window[0] <= now - self.bench.window_seconds:
            window.popleft()
        until = None
        if len(window) >= self.bench.failures:
            until = now + self.bench.duration_seconds
            window.clear()
        if retry_after and (until is not None or self.benched(now)):
            # Also on the failure that starts the bench: its Retry-After is a floor too.
            until = max(until or 0.0, now + retry_after)
            self.floor_until = max(self.floor_until or 0.0, now + retry_after)
        if until is None:
            return False
        started = not self.benched(now)
        self.benched_until = max(self.benched_until or 0.0, until)
        return started

    def lift_bench(self) -> bool:
        """End the bench (it ran out); True if there was one."""
        was = self.benched_until is not None
        self.benched_until = None
        self.floor_until = None
        self._recent_failures.clear()
        return was

    def probe_succeeded(self, now: float) -> bool:
        """A background probe succeeded: end the bench, but not before the provider's
        Retry-After (the bench then ends at that floor). True when it ended now."""
        if self.floor_until is not None and now < self.floor_until:
            self.benched_until = self.floor_until
            return False
        return self.lift_bench()

    def rebench(self, now: float) -> None:
        """A background probe failed: bench again for a full duration."""
        self.benched_until = max(self.benched_until or 0.0, now + self.bench.duration_seconds)

    def healthy(self) -> bool:
        """Availability at or above the configured floor."""
        return self.availability >= self.settings.min_availability

    def _ewma(self, x: float) -> None:
        a = self.settings.ewma_alpha
        self.availability = a * x + (1 - a) * self.availability

    def record_success(self, now: float, *, probe: bool, owner: str = "") -> Transition | None:
        """A successful attempt. Closes the circuit when it was the probe, or when ``owner``
        held the probe that timed out (a late answer is still an answer)."""
        self._ewma(1.0)
        self.consecutive_failures = 0
        self.consecutive_auth_rejections = 0
        if probe and self.state == HALF_OPEN:
            self.probe_deadline = None
            return self._move(CLOSED, "probe succeeded", now)
        if self.is_late_probe(owner):
            # A probe granted since then is no longer the probe: its result is ordinary.
            self.probe_deadline = None
            return self._move(CLOSED, "late probe succeeded", now)
        return None

    def record_failure(self, now: float, *, probe: bool, auth: bool = False) -> Transition | None:
        """A failed attempt that says the endpoint is sick. May open or re-open the circuit."""
        self._ewma(0.0)
        self.consecutive_failures += 1
        if auth:
            self.consecutive_auth_rejections += 1
        if probe and self.state == HALF_OPEN:
            self.probe_deadline = None
            return self._open(now, "probe failed")
        if self.state == CLOSED and self.consecutive_failures >= self.settings.failure_threshold:
            return self._open(now, f"{self.consecutive_failures} consecutive failures")
        return None

    def record_abandoned_probe(self, now: float, reason: str) -> Transition | None:
        """The probe's client went away (or it hung): re-open for another cooldown."""
        if self.state == HALF_OPEN:
            self.probe_deadline = None
            return self._open(now, reason)
        return None

    def try_acquire_probe(self, now: float, probe_timeout: float, owner: str = "") -> bool:
        """Lease the single half-open probe to request ``owner``; False while another is out
        or before cooldown."""
        self.tick(now)
        if self.state != HALF_OPEN or self.probe_in_flight:
            return False
        self.probe_deadline = now + probe_timeout
        self.probe_owner = owner
        return True

    def tick(self, now: float) -> Transition | None:
        """Advance time: an elapsed cooldown half-opens; an overdue probe re-opens."""
        if self.state == OPEN and self.open_until is not None and now >= self.open_until:
            return self._move(HALF_OPEN, "cooldown elapsed", now)
        overdue = self.probe_deadline is not None and now >= self.probe_deadline
        if self.state == HALF_OPEN and overdue:
            self.probe_deadline = None
            self.timed_out_probe = self.probe_owner
            return self._open(now, "probe timed out")
        return None

    def retry_after(self, now: float) -> float:
        """Seconds until this endpoint may take traffic again (0 when it may now)."""
        if self.state == OPEN and self.open_until is not None:
            return max(0.0, self.open_until - now)
        if self.state == HALF_OPEN and self.probe_deadline is not None:
            # A probe usually answers well before its (long) deadline: ask again soon.
            return max(0.0, min(self.probe_deadline - now, self.settings.cooldown_seconds))
        return 0.0

    def _open(self, now: float, reason: str) -> Transition:
        self.open_until = now + self.settings.cooldown_seconds
        return self._move(OPEN, reason, now)

    def _move(self, new: str, reason: str, now: float) -> Transition:
        old, self.state = self.state, new
        if new == CLOSED:
            self.timed_out_probe = ""
        if new != OPEN:
            self.open_until = None
        return Transition(old, new, reason)
