"""DegradedModeActor: flips the deployment into degraded mode when too few endpoints are
healthy, and back, without flapping (spec "Degraded mode").

A scheduled health pass takes the healthy-endpoint ratio from a view of every endpoint's
state (an endpoint with no reported state yet counts as healthy, and while degraded so does
one awaiting its probe: see ``is_healthy``). Entry needs the ratio below
``threshold`` for ``entry_seconds``; exit needs it at or above for the longer
``exit_seconds``. Transitions are ``ModeChanged`` events on ``llmgw.events.mode``; ModelActors
follow them (no exploration while degraded).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.base import Actor, ActorContext, Serve
from actors.health import keep_newest
from schemas import EndpointState, ModeChanged, ModeRequest, subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Envelope
    from schemas.config import DegradedConfig

logger = logging.getLogger(__name__)

NORMAL = "normal"
DEGRADED = "degraded"


class DegradedMode:
    """The state machine (pure): feed it ratios with timestamps."""

    def __init__(self, settings: DegradedConfig, now: float) -> None:
        self.settings = settings
        self.mode = NORMAL
        self.since = now
        self._streak_since: float | None = None

    def observe(self, ratio: float, now: float) -> bool:
        """One health pass; True when the mode changed."""
        if not self.settings.enabled:
            return False
        degraded = self.mode == DEGRADED
        wants_change = (
            (ratio >= self.settings.threshold) if degraded else (ratio < self.settings.threshold)
        )
        if not wants_change:
            self._streak_since = None
            return False
        if self._streak_since is None:
            self._streak_since = now
        hold = self.settings.exit_seconds if degraded else self.settings.entry_seconds
        if now - self._streak_since < hold:
            return False
        self.mode = NORMAL if degraded else DEGRADED
        self.since = now
        self._streak_since = None
        return True


def is_healthy(
    st: EndpointState, now: float, min_availability: float, *, degraded: bool = False
) -> bool:
    """Not benched, closed circuit, availability at or above the floor.

    While degraded, no client traffic probes or scores a route the configured order leaves
    out, so a route awaiting its probe (half-open, none out) counts as healthy and
    availability (which only traffic moves) is not asked: unprobed is usable until a probe
    says otherwise. Otherwise a route that opened while degraded could never come back, and
    the deployment could never leave degraded mode.
    """
    if st.benched_until is not None and now < st.benched_until:
        return False
    if degraded:
        return st.circuit_state == "closed" or (
            st.circuit_state == "half_open" and not st.probe_in_flight
        )
    return st.circuit_state == "closed" and st.availability >= min_availability


@dataclass(frozen=True, slots=True)
class _Pass:
    """Local timer message: run a health pass."""


class DegradedModeActor(Actor):
    """Owns the deployment's mode; answers ModeRequest with the current ModeChanged."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        settings: DegradedConfig,
        min_availability: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = "degraded_mode"
        self.serves = (Serve(subjects.ENDPOINT_STATE_ANY), Serve(subjects.MODE_GET))
        self._endpoints = endpoints
        self._settings = settings
        self._floor = min_availability
        self._clock = clock

    async def on_start(self, ctx: ActorContext) -> None:
        """Start in normal mode and schedule the first pass."""
        self.ctx = ctx
        self._states: dict[str, EndpointState] = {}
        self.machine = DegradedMode(self._settings, self._clock())
        self.ratio = 1.0
        ctx.call_later(self._settings.pass_interval_seconds, _Pass())

    def current(self) -> ModeChanged:
        """The mode as an event."""
        return ModeChanged(
            mode=self.machine.mode, since=self.machine.since, ratio=self.ratio, ts=self._clock()
        )

    def healthy_ratio(self, now: float) -> float:
        """Share of known endpoints that are healthy (unreported ones count as healthy)."""
        if not self._endpoints:
            return 1.0
        degraded = self.machine.mode == DEGRADED
        healthy = sum(
            1
            for e in self._endpoints
            if (st := self._states.get(e)) is None
            or is_healthy(st, now, self._floor, degraded=degraded)
        )
        return healthy / len(self._endpoints)

    async def health_pass(self) -> None:
        """Take the ratio and advance the state machine; publish a change."""
        now = self._clock()
        self.ratio = self.healthy_ratio(now)
        if self.machine.observe(self.ratio, now):
            log = logger.warning if self.machine.mode == DEGRADED else logger.info
            log("deployment mode -> %s (healthy ratio %.2f)", self.machine.mode, self.ratio)
            await self.ctx.publish(subjects.event("mode"), self.current())

    async def handle(self, env: Envelope) -> None:
        """Fold endpoint states; answer mode requests."""
        match env.message:
            case EndpointState() as st:
                keep_newest(self._states, st)
            case ModeRequest():
                await env.respond(self.current())

    async def handle_local(self, msg: object) -> None:
        """The scheduled pass."""
        if isinstance(msg, _Pass):
            await self.health_pass()
            self.ctx.call_later(self._settings.pass_interval_seconds, _Pass())
