"""ProbeBackoff: when the next background probe of something out of rotation is due.

A benched route and a muted credential are re-validated by background probes (the prober
sends one tiny request): the first one after the circuit cooldown (sooner when the bench or
mute is short: ``probe_after_fraction`` of it), then each gap twice the last up to a cap (a
bench's ``probe_max_interval_seconds``: a provider back from a long outage is found within
that, not after the next doubled gap), as long as a probe still comes before the bench or
mute ends (its end brings it back anyway).
"""

from __future__ import annotations

import math


def first_probe_after(cooldown: float, fraction: float, period: float) -> float:
    """The first probe's delay into a bench or mute of ``period`` seconds."""
    return min(cooldown, fraction * period)


class ProbeBackoff:
    """Owns the gap to the next probe of one benched route or muted credential."""

    __slots__ = ("cap", "gap")

    def __init__(self, first: float, cap: float = math.inf) -> None:
        self.gap = min(first, cap)
        self.cap = cap

    def next_delay(self, now: float, until: float | None) -> float | None:
        """Seconds until the next probe, doubling the gap after it (up to ``cap``); None when
        it would come at or after ``until`` (or nothing is out)."""
        if until is None or now + self.gap >= until:
            return None
        delay, self.gap = self.gap, min(self.gap * 2.0, self.cap)
        return delay
