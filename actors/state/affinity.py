"""Session affinity: a per-(caller, model) pin to the last-selected endpoint (pure state).

Spec: five-minute sliding TTL; dropped the moment the pinned endpoint errors; a fresh pick
when the pinned endpoint is inadmissible; expired entries swept lazily once the table is past
the sweep threshold. Times are wall-clock seconds so a snapshot survives a restart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Pin:
    """A caller's pinned endpoint and when the pin lapses."""

    endpoint: str
    expires: float


class AffinityTable:
    """Owns the pins of one model. Callers are affinity keys (``key:<hash>``, ``ip:<addr>``)."""

    def __init__(self, ttl: float, sweep_threshold: int = 1000) -> None:
        self.ttl = ttl
        self.sweep_threshold = sweep_threshold
        self._pins: dict[str, Pin] = {}

    def __len__(self) -> int:
        return len(self._pins)

    def get(self, caller: str, now: float) -> str | None:
        """The live pin of ``caller`` (an expired one is dropped), without refreshing it."""
        pin = self._pins.get(caller)
        if pin is None:
            return None
        if pin.expires <= now:
            del self._pins[caller]
            return None
        return pin.endpoint

    def pin(self, caller: str, endpoint: str, now: float) -> None:
        """Pin (or re-pin, refreshing the TTL) ``caller`` to ``endpoint``."""
        self._pins[caller] = Pin(endpoint, now + self.ttl)
        if len(self._pins) > self.sweep_threshold:
            self.sweep(now)

    def drop(self, caller: str, endpoint: str | None = None) -> bool:
        """Drop ``caller``'s pin (only if it points at ``endpoint``, when given)."""
        pin = self._pins.get(caller)
        if pin is None or (endpoint is not None and pin.endpoint != endpoint):
            return False
        del self._pins[caller]
        return True

    def sweep(self, now: float) -> int:
        """Remove every expired pin; returns how many."""
        dead = [c for c, p in self._pins.items() if p.expires <= now]
        for c in dead:
            del self._pins[c]
        return len(dead)

    def snapshot(self, now: float) -> dict[str, tuple[str, float]]:
        """Live pins as ``{caller: (endpoint, expires)}``."""
        return {c: (p.endpoint, p.expires) for c, p in self._pins.items() if p.expires > now}

    def restore(self, data: dict[str, tuple[str, float]], now: float) -> None:
        """Load pins from :meth:`snapshot` output, skipping expired ones."""
        for caller, (endpoint, expires) in data.items():
            if expires > now:
                self._pins[caller] = Pin(endpoint, expires)
