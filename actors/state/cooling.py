"""Cooling: credentials a provider asked to slow down (its 429), per route (pure state).

A rate-limit answer is back-pressure, not sickness: the credential that got it cools for
what the provider said (``Retry-After``, or its ``x-ratelimit-reset-*`` headers, folded into
the observation's ``retry_after`` by the adapter), else (no hint, or a wait of 0: a 429 that
let the next request go at once would be met again at once, as often as a request's
attempts allow) for an adaptive backoff that starts
at ``initial`` seconds and doubles while 429s continue, up to ``cap``; a success resets the
backoff. A cooling never shortens one already running. Only a 429 that arrives when the
credential is not cooling doubles the backoff: the answers of a burst already in flight when
the provider started refusing are one signal, not many (as TCP cuts once per window).

The credential ``""`` stands for a route without keys. Nothing here does I/O; the
KeyPoolActor (owner) and the ModelActor's view of the pool both fold observations into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


@dataclass(slots=True)
class _Key:
    until: float = 0.0
    level: int = 0  # the next cooling without a provider hint lasts initial * 2**level


class Cooling:
    """Owns the cooling ends and backoff levels of one pool's credentials."""

    __slots__ = ("_cap", "_initial", "_keys", "latest")

    def __init__(self, initial: float = 1.0, cap: float = 60.0) -> None:
        self._initial = initial
        self._cap = cap
        self._keys: dict[str, _Key] = {}
        # No cooling ends after this (it only grows): from then on nothing cools, and the
        # pool's selection skips asking key by key.
        self.latest = 0.0

    def until(self, cid: str, now: float) -> float | None:
        """When ``cid``'s cooling ends, or None when it is not cooling."""
        k = self._keys.get(cid)
        return k.until if k is not None and k.until > now else None

    def rate_limited(self, cid: str, now: float, retry_after: float | None) -> float | None:
        """Fold one 429 for ``cid``; returns the new end of its cooling when this starts or
        lengthens one, else None."""
        k = self._keys.setdefault(cid, _Key())
        if retry_after is not None and retry_after > 0:
            seconds = retry_after
        elif k.until > now:
            return None  # an echo of the burst that started this cooling
        else:
            seconds = min(self._initial * 2.0**k.level, self._cap)
            k.level += 1
        until = now + seconds
        if until <= k.until or seconds <= 0:
            return None
        k.until = until
        self.latest = max(self.latest, until)
        return until

    def succeeded(self, cid: str) -> None:
        """An answer from ``cid``: the provider takes its pace again (the backoff resets; a
        cooling running is kept, the success was sent before it)."""
        k = self._keys.get(cid)
        if k is not None:
            k.level = 0

    def live(self, now: float) -> dict[str, float]:
        """Cooling ends by credential, of those cooling at ``now``."""
        return {cid: k.until for cid, k in self._keys.items() if k.until > now}

    def merge(self, ends: dict[str, float]) -> None:
        """Fold an owner's published cooling ends into this copy (never shortening one)."""
        for cid, until in ends.items():
            k = self._keys.setdefault(cid, _Key())
            k.until = max(k.until, until)
            self.latest = max(self.latest, k.until)

    def forget(self, keep: frozenset[str]) -> None:
        """Drop credentials no longer declared (``""``, the keyless route, always stays)."""
        for cid in [c for c in self._keys if c and c not in keep]:
            del self._keys[cid]


class _Route(Protocol):
    @property
    def endpoint(self) -> str: ...


R = TypeVar("R", bound=_Route)


class CooledRoutes:
    """Owns when each route a 429 took out of rotation is back: it is then given the first
    request it can take, so it is back in use at its provider's reset, not whenever the draw
    next lands on it (and one request, not a herd, finds out whether it takes traffic)."""

    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self._ends: dict[str, float] = {}

    def cooled(self, endpoint: str, until: float | None) -> None:
        """``endpoint`` is cooling until ``until`` (None: it is not, another key is free)."""
        if until is not None:
            self._ends[endpoint] = until

    def back(
        self,
        routes: Iterable[R],
        cooling_until: Callable[[str], float | None],
        now: float,
        *,
        take: bool,
    ) -> R | None:
        """The first of ``routes`` whose cooling is over (and not started again); ``take``
        hands it its one request (a dry run does not)."""
        for r in routes:
            until = self._ends.get(r.endpoint)
            if until is None or until > now or cooling_until(r.endpoint) is not None:
                continue
            if take:
                del self._ends[r.endpoint]
            return r
        return None
