"""EvidenceGate: when the scoring owner publishes its evidence (pure state, injected time).

Evidence moves with every observation; each publish rebuilds every ingress's orderings. The
gate publishes a change at once when the last publish is an interval old (leading edge), and
at once as well when it flips what a request would be routed to: an ordering, a model's
health or the mode (the signature differs from the one last published). Other changes wait
for the interval's end (trailing edge). So right after a model fails, is rate limited or
nears its allowance, or the deployment turns degraded, the views follow at once, and a
steady stream of observations still costs at most one publish an interval. Flips are
published at once at most ``flips`` times an interval (evidence oscillating between two
near-equal models must not become a publish per observation); after that they wait too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable


class EvidenceGate:
    """Owns the publish timing of one evidence stream (see the module docstring)."""

    def __init__(self, interval: float, flips: int) -> None:
        self.interval = interval
        self._flips_max = flips
        self._last = float("-inf")  # when the evidence was last published
        self._window = float("-inf")  # when the current interval began
        self._flips = 0  # flips published at once since the interval began
        self._shown: Hashable = None  # the signature last published
        self.dirty = False  # changed since the last publish

    def changed(
        self, now: float, signature: Callable[[], Hashable] | None, *, force: bool = False
    ) -> bool:
        """The evidence changed (``signature``: what its orderings and mode are now, asked
        only when it decides, None for a change not worth checking for a flip; ``force``: a
        change the views need at once whatever the rate). True: publish it now; False:
        publish it at :meth:`due`."""
        self.dirty = True
        if force or now - self._last >= self.interval:
            return True
        if signature is not None and self._flips < self._flips_max and signature() != self._shown:
            self._flips += 1
            return True
        return False

    def due(self, now: float) -> float:
        """Seconds from ``now`` until a change held back now may be published."""
        return max(0.0, self._last + self.interval - now)

    def flipped(self, signature: Hashable) -> bool:
        """Whether ``signature`` differs from the one last published."""
        return signature != self._shown

    def published(self, signature: Hashable, now: float) -> None:
        """The evidence with ``signature`` was published at ``now``."""
        if now - self._window >= self.interval:
            self._window, self._flips = now, 0
        self._last, self._shown, self.dirty = now, signature, False
