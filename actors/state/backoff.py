"""ProbeBackoff: when the next background probe of something out of rotation is due.

A benched route and a muted credential are re-validated by background probes (the prober
sends one tiny request): the first one after the circuit cooldown (sooner when the bench or
mute is short: ``probe_after_fraction`` of it), then each gap twice the last, as long as a
probe still comes before the bench or mute ends (its end brings it back anyway).
"""

from __future__ import annotations


def first_probe_after(cooldown: float, fraction: float, period: float) -> float:
    """The first probe's delay into a bench or mute of ``period`` seconds."""
    return min(cooldown, fraction * period)


class ProbeBackoff:
    """Owns the gap to the next probe of one benched route or muted credential."""

    __slots__ = ("gap",)

    def __init__(self, first: float) -> None:
        self.gap = first

    def next_delay(self, now: float, until: float | None) -> float | None:
        """Seconds until the next probe, doubling the gap after it; None when it would come at
        or after ``until`` (or nothing is out)."""
        if until is None or now + self.gap >= until:
            return None
        delay, self.gap = self.gap, self.gap * 2.0
        return delay
