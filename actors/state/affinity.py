"""Session affinity: a per-(caller, model) pin to the last-selected endpoint (pure state).

Spec: five-minute sliding TTL; dropped the moment the pinned endpoint errors; a fresh pick
when the pinned endpoint is inadmissible; expired entries swept lazily once the table is past
the sweep threshold (then once it has doubled, at most ``expiring.CAP`` pins, the least
recently pinned out first: ``actors.state.expiring``). Times are wall-clock seconds so a
snapshot survives a restart.

Beyond the spec, a caller moved off its endpoint by an error (or because it left rotation)
keeps it as its *home* while its pin lives; if the home is then benched (sickness that
lasts: an outage), the caller returns to it once it is back in rotation (as a consistent-hash
ring gives a recovered host its keys back), instead of staying on the fallback for as long as
it keeps calling, which left a recovered route idle. A home that was never benched (one
error, an open circuit, a weight set to 0) keeps the spec's behaviour: the new pin stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.state import expiring

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(slots=True)
class Pin:
    """A caller's pinned endpoint ("": none since it was moved off its home), when the pin
    lapses, its home (the endpoint it was moved off, "": none) and whether that home was
    benched since."""

    endpoint: str
    expires: float
    home: str = ""
    home_benched: bool = False


class AffinityTable:
    """Owns the pins of one model. Callers are affinity keys (``key:<hash>``, ``ip:<addr>``)."""

    def __init__(self, ttl: float, sweep_threshold: int = 1000) -> None:
        self.ttl = ttl
        self.sweep_threshold = sweep_threshold
        self._next_sweep = sweep_threshold  # the size past which expired pins are swept
        self._pins: dict[str, Pin] = {}  # least recently pinned first

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
        return pin.endpoint or None

    def home(self, caller: str) -> tuple[str, bool]:
        """The endpoint ``caller`` was moved off ("": none) and whether it was benched since
        (then the caller returns to it once it is back)."""
        pin = self._pins.get(caller)
        return ("", False) if pin is None else (pin.home, pin.home_benched)

    def returning(self, caller: str, benched: Callable[[str], bool], *, mark: bool) -> str:
        """The home ``caller`` goes back to once it is in rotation: its home if it was benched
        since, else "" (``benched`` says whether an endpoint is benched now; ``mark``: note
        it, a dry run does not)."""
        home, was_benched = self.home(caller)
        if home and not was_benched and mark and benched(home):
            self.home_benched(caller)
        return home if was_benched else ""

    def home_benched(self, caller: str) -> None:
        """``caller``'s home is benched: it returns there once the bench is over."""
        pin = self._pins.get(caller)
        if pin is not None and pin.home:
            pin.home_benched = True

    def pin(self, caller: str, endpoint: str, now: float) -> None:
        """Pin (or re-pin, refreshing the TTL) ``caller`` to ``endpoint``; its home is kept
        until it is back there."""
        old = self._pins.pop(caller, None)  # re-inserted: the table's order is the pins' age
        if old is None or old.home == endpoint:
            self._pins[caller] = Pin(endpoint, now + self.ttl)
        else:
            self._pins[caller] = Pin(endpoint, now + self.ttl, old.home, old.home_benched)
        if len(self._pins) > self._next_sweep:
            self.sweep(now)

    def drop(self, caller: str, endpoint: str | None = None) -> bool:
        """Drop ``caller``'s pin (only if it points at ``endpoint``, when given); the endpoint
        it pointed at becomes its home (a home it had already stays)."""
        pin = self._pins.get(caller)
        if pin is None or not pin.endpoint or (endpoint is not None and pin.endpoint != endpoint):
            return False
        pin.home = pin.home or pin.endpoint
        pin.endpoint = ""
        return True

    def sweep(self, now: float) -> int:
        """Remove every expired pin (and the oldest past ``expiring.CAP``); returns how many
        expired."""
        dead, self._next_sweep = expiring.sweep(self._pins, now, self.sweep_threshold)
        return dead

    def snapshot(self, now: float) -> dict[str, tuple[str, float]]:
        """Live pins as ``{caller: (endpoint, expires)}``."""
        return {
            c: (p.endpoint, p.expires)
            for c, p in self._pins.items()
            if p.expires > now and p.endpoint
        }

    def restore(self, data: dict[str, tuple[str, float]], now: float) -> None:
        """Load pins from :meth:`snapshot` output, skipping expired ones."""
        for caller, (endpoint, expires) in data.items():
            if expires > now:
                self._pins[caller] = Pin(endpoint, expires)
