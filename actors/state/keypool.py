"""KeyPool: one route's upstream keys, their mutes and the callers bound to them (pure state).

Spec "Reserving upstream keys for a tier". Every method takes ``now`` (wall-clock seconds);
nothing here does I/O, so the KeyPoolActor (owner of declarations and mutes) and the
ModelActor (which decides plans from a view of them and owns the bindings) share this class.

- Selection: keys a role may not spend (``min_role`` above it) are invisible; among visible
  keys the most reserved go first, then declared order; muted keys are skipped.
- Binding: a caller stays on one key for ``binding_ttl_seconds`` (sliding), honoured only for
  the role that made it. A binding to a muted key survives (acquire picks around it); a
  declaration change drops every binding whose role's preferred key moved, or whose key the
  role can no longer spend.
- Muting: a key-specific failure (no status, 401, 402, 403, 408, 425, 5xx) mutes the key
  for ``mute_seconds``; a caller's only key tolerates ``sole_key_tolerance`` consecutive
  failures, then mutes for ``sole_key_backoff_seconds`` doubling up to the max. A spent quota
  or billing (``quota``) mutes at once for ``mute_seconds`` doubling each time the key is
  found still spent (a request or its probe) up to ``quota_mute_max_seconds``: it will not
  come back in minutes, and every return would fail a request. A success (a request's or a
  probe's) resets the doubling. A provider ``Retry-After`` (or quota reset) is a floor, and a
  mute never shortens one already running.
- Cooling: a provider's rate limit (a 429 that is not a quota exhaustion) does not mute:
  the key cools (actors/state/cooling.py) and selection picks around it; a route all of
  whose keys the caller may spend are cooling (or muted) is cooling, and passed over.
- Refusal: no usable key -> KeyPoolExhaustedError; when an unrestricted caller could still be
  served, KeyPoolRoleRestrictedError (not the endpoint's failure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.state import expiring
from actors.state.cooling import Cooling
from schemas import KeyPoolExhaustedError, KeyPoolRoleRestrictedError
from schemas.keys import role_rank

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

    from schemas.config import KeyPoolConfig

_KEY_SPECIFIC = frozenset({401, 402, 403, 408, 425, 429})


ANSWERED_KINDS = frozenset({"bad_response", "truncated", "empty_stream", "idle"})
"""Error kinds of a failure after the upstream answered (its answer malformed, cut or
stalled): it took the key, so the failure says nothing of it."""


def is_key_specific(status: int | None) -> bool:
    """Whether a failure with ``status`` says something about the key (None: no answer)."""
    return status is None or status in _KEY_SPECIFIC or status >= 500


@dataclass(slots=True)
class _Binding:
    credential_id: str
    role: str | None
    expires: float


_UNRANKED = 1e300  # a key with no preference: after every ranked one but those at infinity


class KeyPool:
    """Owns one pool's declared keys, mutes, failure streaks and caller bindings."""

    def __init__(
        self, pool: str, settings: KeyPoolConfig, keys: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.pool = pool
        self.settings = settings
        self._keys: tuple[tuple[str, str], ...] = ()
        self._ids: frozenset[str] = frozenset()
        self._order: dict[int, tuple[str, ...]] = {}
        self._by_role: dict[str | None, tuple[str, ...]] = {}  # the same, by role name
        self._mutes: dict[str, float] = {}
        # No mute ends after this (it only grows; see _quiet): every write to _mutes raises it.
        self._mutes_end = 0.0
        self._floors: dict[str, float] = {}  # Retry-After: no probe lifts a mute before it
        self._periods: dict[str, float] = {}  # how long each key was last muted for
        self._streaks: dict[str, int] = {}
        self._levels: dict[str, int] = {}
        self._quota: set[str] = set()  # keys whose mute is a spent quota's
        self._bindings: dict[str, _Binding] = {}  # least recently used first
        self._next_sweep = settings.sweep_threshold  # the size past which it is swept
        self.cooling = Cooling(settings.cooling_seconds, settings.cooling_max_seconds)
        # credential_choice least_remaining_quota: a sort key per key (lower is spent first;
        # keys without one after those ranked finite); None keeps the declared preference.
        self.preference: dict[str, float] | None = None
        # A model's view only: whether a key's provider has no request left for it now (its
        # pace, actors/state/rate_pace.py): such a key is drawn after those with some.
        self.spent: Callable[[str, float], bool] | None = None
        self.declare(keys)

    # -- declaration --------------------------------------------------------------------

    @property
    def declared(self) -> tuple[tuple[str, str], ...]:
        """(credential id, min_role) in declared order."""
        return self._keys

    def declare(self, keys: Iterable[tuple[str, str]]) -> int:
        """Replace the declaration; returns how many bindings it dropped.

        Raises ValueError for an unknown role name.
        """
        new = tuple(keys)
        if new == self._keys:
            return 0
        for _, role in new:
            role_rank(role)
        roles = {b.role for b in self._bindings.values()}
        before = {r: self.preferred(r) for r in roles}
        self._keys = new
        self._ids = frozenset(cid for cid, _ in new)
        self._order.clear()
        self._by_role.clear()
        # Everything kept per key goes with it: a removed key's floor or period would stay
        # for good (and a key re-added under its id would inherit them).
        for table in (self._mutes, self._streaks, self._levels, self._floors, self._periods):
            for cid in [c for c in table if c not in self._ids]:
                del table[cid]
        self._quota.intersection_update(self._ids)
        self.cooling.forget(self._ids)
        dropped = [
            c
            for c, b in self._bindings.items()
            if b.credential_id not in self.visible(b.role)
            or self.preferred(b.role) != before[b.role]
        ]
        for caller in dropped:
            del self._bindings[caller]
        return len(dropped)

    def visible(self, role: str | None) -> tuple[str, ...]:
        """The keys ``role`` may spend, most reserved first, then in declared order."""
        known = self._by_role.get(role)
        if known is not None:
            return known
        rank = role_rank(role)
        order = self._order.get(rank)
        if order is None:
            indexed = [
                (i, cid, role_rank(r))
                for i, (cid, r) in enumerate(self._keys)
                if role_rank(r) <= rank
            ]
            order = tuple(cid for _, cid, _ in sorted(indexed, key=lambda t: (-t[2], t[0])))
            self._order[rank] = order
        self._by_role[role] = order
        return order

    def preferred(self, role: str | None) -> str | None:
        """The first key ``role`` would spend with nothing muted."""
        order = self.visible(role)
        return order[0] if order else None

    # -- selection ----------------------------------------------------------------------

    def muted_until(self, cid: str, now: float) -> float | None:
        """When ``cid``'s mute ends, or None when it is not muted."""
        until = self._mutes.get(cid)
        return until if until is not None and until > now else None

    def usable(self, role: str | None, now: float) -> list[str]:
        """Visible keys that are neither muted nor cooling, in preference order."""
        if self.preference is None and self._quiet(now):
            return list(self.visible(role))
        cooling = self.cooling
        keys = [
            cid
            for cid in self.visible(role)
            if self.muted_until(cid, now) is None and cooling.until(cid, now) is None
        ]
        if self.preference is not None:
            prefer = self.preference
            keys.sort(key=lambda cid: prefer.get(cid, _UNRANKED))
        return keys

    def spares(self, cid: str, role: str | None, now: float, limit: int) -> tuple[str, ...]:
        """Up to ``limit`` usable keys other than ``cid``, in preference order: where a
        request goes when the upstream refuses ``cid`` itself."""
        if len(self._keys) < 2:
            return ()
        usable: Sequence[str] = self.usable(role, now)
        if self.spent is not None:
            usable, _ = _spent_last(usable, self.spent, now)
        return tuple(k for k in usable if k != cid)[:limit]

    def cooling_until(self, role: str | None, now: float) -> float | None:
        """When this route may serve ``role`` again if cooling is all that holds it out: the
        first end among its cooling keys while every key ``role`` may spend is cooling or
        muted (for a pool without keys, the route's own cooling); None while a key is free,
        or when only mutes hold it out (a refusal)."""
        if not self._keys:
            return self.cooling.until("", now)
        if self._quiet(now):
            return None  # a key is free (or the role sees none: a refusal, not cooling)
        ends = []
        for cid in self.visible(role):
            until = self.cooling.until(cid, now)
            if until is None:
                if self.muted_until(cid, now) is None:
                    return None
                continue
            ends.append(until)
        return min(ends) if ends else None

    def peek(self, caller: str, role: str | None, now: float) -> str:
        """The key ``caller`` would spend now, without binding. ``""`` for a pool without keys.

        Raises KeyPoolExhaustedError or KeyPoolRoleRestrictedError.
        """
        if not self._keys:
            return ""
        # Quiet and no preference: the usable keys are the visible ones, as they are.
        quiet = self.preference is None and self._quiet(now)
        usable: Sequence[str] = self.visible(role) if quiet else self.usable(role, now)
        if not usable:
            raise self.refusal(role, now)
        spent: Collection[str] = ()
        if self.spent is not None and len(usable) > 1:
            usable, spent = _spent_last(usable, self.spent, now)
        b = self._bindings.get(caller)
        if (
            self.preference is None
            and b is not None
            and b.role == role
            and b.expires > now
            and b.credential_id in usable
            # Off a key with none left while another has some.
            and (b.credential_id not in spent or usable[0] in spent)
        ):
            return b.credential_id  # by quota, the allowance decides, not the binding
        return usable[0]

    def acquire(self, caller: str, role: str | None, now: float) -> str:
        """The key ``caller`` spends now, binding (or refreshing) it. Raises like :meth:`peek`."""
        cid = self.peek(caller, role, now)
        if not cid:
            return cid
        bindings = self._bindings
        b = bindings.pop(caller, None)  # re-inserted: the table's order is the bindings' age
        if b is not None and b.role == role and b.expires > now:
            if b.credential_id == cid:
                b.expires = now + self.settings.binding_ttl_seconds
            bindings[caller] = b
            return cid  # a binding to a merely muted key survives
        bindings[caller] = _Binding(cid, role, now + self.settings.binding_ttl_seconds)
        if len(bindings) > self._next_sweep:
            self.sweep(now)
        return cid

    def bound(self, caller: str, now: float) -> tuple[str, str | None] | None:
        """``caller``'s live binding as (credential id, role), or None."""
        b = self._bindings.get(caller)
        return (b.credential_id, b.role) if b is not None and b.expires > now else None

    def sweep(self, now: float) -> int:
        """Drop expired bindings (and the oldest past ``expiring.CAP``: see
        ``actors.state.expiring``); returns how many expired."""
        threshold = self.settings.sweep_threshold
        dead, self._next_sweep = expiring.sweep(self._bindings, now, threshold)
        return dead

    def refusal(self, role: str | None, now: float) -> KeyPoolExhaustedError:
        """Why ``role`` gets no key now: KeyPoolRoleRestrictedError when an unrestricted
        caller could still be served, else KeyPoolExhaustedError."""
        mutes = [u for cid in self.visible(role) if (u := self.muted_until(cid, now))]
        retry = min(mutes) - now if mutes else None
        if self.usable(None, now):
            return KeyPoolRoleRestrictedError(
                f"no upstream key of {self.pool} is available to role {role}",
                endpoint=self.pool,
                retry_after=retry,
                kind="key_pool_role_restricted",
            )
        return KeyPoolExhaustedError(
            f"every upstream key of {self.pool} is muted",
            endpoint=self.pool,
            retry_after=retry,
            kind="key_pool_exhausted",
        )

    # -- what happened ------------------------------------------------------------------

    def record(
        self,
        cid: str,
        *,
        status: int | None,
        outcome: str,
        role: str | None,
        now: float,
        retry_after: float | None = None,
        quota: bool = False,
        kind: str | None = None,
    ) -> float | None:
        """Fold one attempt's result (``quota``: it said the key's quota or billing is spent;
        ``kind``: its error kind); returns the new mute end when this mutes ``cid``."""
        if outcome == "success":
            self.cooling.succeeded(cid)
        if cid not in self._ids or outcome == "cancelled" or kind in ANSWERED_KINDS:
            # A malformed answer muted a route's only key as if refused: three of them, and
            # every caller got 503 key_pool_exhausted while the upstream took the key.
            return None
        if outcome == "client_error" and status is None:
            # The request's, whatever the key: an adapter refused it unsent, or the model's
            # answer had nothing to hand on (empty, a malformed tool call). Read as "no
            # answer", three of one caller's muted a route's only key for every caller.
            return None
        if outcome == "success" or not (quota or is_key_specific(status)):
            # The upstream accepted the key (a 400 is about the request, not the key).
            self._streaks.pop(cid, None)
            self._levels.pop(cid, None)
            self._quota.discard(cid)
            return None
        streak = self._streaks.get(cid, 0) + 1
        self._streaks[cid] = streak
        s = self.settings
        sole = self.visible(role) == (cid,)
        if quota:
            if cid in self._quota and self.muted_until(cid, now) is not None:
                # The answer to a request sent before the mute: no news, no doubling.
                if not retry_after or now + retry_after <= self._mutes[cid]:
                    return None
                seconds = retry_after
            else:
                if cid not in self._quota:
                    self._levels.pop(cid, None)  # a sole key's backoff is another count
                self._quota.add(cid)
                seconds = self._quota_backoff(cid)
        elif sole:
            if streak <= s.sole_key_tolerance:
                return None
            level = self._levels.get(cid, 0)
            self._levels[cid] = level + 1
            seconds = min(s.sole_key_backoff_seconds * 2.0**level, s.sole_key_backoff_max_seconds)
        else:
            seconds = s.mute_seconds
        seconds = max(seconds, retry_after or 0.0)
        until = max(self._mutes.get(cid, 0.0), now + seconds)
        self._mute(cid, until)
        self._periods[cid] = seconds
        if retry_after:
            self._floors[cid] = max(self._floors.get(cid, 0.0), now + retry_after)
        return until

    def rate_limited(self, cid: str, now: float, retry_after: float | None) -> float | None:
        """A provider's 429 for ``cid`` (``""``: the route has no keys): cool it; returns the
        new end of its cooling when this starts or lengthens one. Not a mute, and not a
        failure of the key's streak."""
        if cid and cid not in self._ids:
            return None
        return self.cooling.rate_limited(cid, now, retry_after)

    def mute_period(self, cid: str) -> float:
        """How long ``cid`` was last muted for (a sole key's backoff, or ``mute_seconds``)."""
        return self._periods.get(cid, self.settings.mute_seconds)

    def lift(self, cid: str, now: float) -> float | None:
        """A background probe found ``cid`` working: unmute it, but never before the
        provider's Retry-After. Returns when it is (or will be) back, None if not muted."""
        if self.muted_until(cid, now) is None:
            return None
        back = max(now, self._floors.get(cid, 0.0))
        self._mute(cid, back)
        self._streaks.pop(cid, None)
        if cid in self._quota:  # the quota is back: its next exhaustion starts short again
            self._quota.discard(cid)
            self._levels.pop(cid, None)
        return back

    def lift_all(self, now: float) -> list[str]:
        """An operator lifted the route: unmute every key (never before a Retry-After).
        Returns the credential ids that were muted."""
        muted = list(self.mutes(now))
        for cid in muted:
            self.lift(cid, now)
        return muted

    def remute(self, cid: str, now: float) -> float:
        """A background probe found ``cid`` still failing: mute it again for the period it
        was muted for (a sole key's backoff, or ``mute_seconds``), or, a spent quota, for the
        next, doubled one."""
        if cid in self._quota:
            self._periods[cid] = self._quota_backoff(cid)
        period = self._periods.get(cid, self.settings.mute_seconds)
        until = max(self._mutes.get(cid, 0.0), now + period)
        self._mute(cid, until)
        return until

    def _quota_backoff(self, cid: str) -> float:
        """The next mute of a spent quota: ``mute_seconds`` doubling per time in a row the key
        was found spent, up to ``quota_mute_max_seconds``."""
        s = self.settings
        level = self._levels.get(cid, 0)
        self._levels[cid] = level + 1
        return min(s.mute_seconds * 2.0**level, max(s.quota_mute_max_seconds, s.mute_seconds))

    def mutes(self, now: float) -> dict[str, float]:
        """Live mutes by credential id."""
        return {cid: u for cid, u in self._mutes.items() if u > now}

    def durable(self, now: float) -> dict[str, tuple[float, float, float, int]]:
        """What must outlive a restart: each live mute as (until, Retry-After floor, period,
        sole-key backoff level)."""
        return {
            cid: (
                until,
                self._floors.get(cid, 0.0),
                self.mute_period(cid),
                self._levels.get(cid, 0),
            )
            for cid, until in self.mutes(now).items()
        }

    def restore(
        self, mutes: Mapping[str, tuple[float, float, float, int]], now: float
    ) -> list[str]:
        """Take back what :meth:`durable` returned for keys still declared; returns the
        credential ids muted again."""
        back = []
        for cid, (until, floor, period, level) in mutes.items():
            if cid not in self._ids or until <= now:
                continue
            self._mute(cid, until)
            if floor > now:
                self._floors[cid] = floor
            self._periods[cid] = period
            if level:
                self._levels[cid] = level
            back.append(cid)
        return back

    def set_mutes(self, mutes: Mapping[str, float]) -> None:
        """Replace the mutes (a view folding its owner's state)."""
        self._mutes = dict(mutes)
        self._mutes_end = max(self._mutes_end, *self._mutes.values(), 0.0)

    def _mute(self, cid: str, until: float) -> None:
        self._mutes[cid] = until
        self._mutes_end = max(self._mutes_end, until)

    def _quiet(self, now: float) -> bool:
        """Whether no key is muted or cooling at ``now`` (the common case: then every
        visible key is usable, without a look at each one's mute and cooling)."""
        return now >= self._mutes_end and now >= self.cooling.latest

    def expire(self, now: float) -> list[str]:
        """Forget mutes that have ended; returns their credential ids."""
        done = [cid for cid, u in self._mutes.items() if u <= now]
        for cid in done:
            del self._mutes[cid]
        return done


def declaration_of(
    keys: Sequence[tuple[str, str]], roles: Mapping[str, str]
) -> list[tuple[str, str]]:
    """``keys`` with each ``min_role`` raised to ``roles[cid]`` when that is more restrictive."""
    out = []
    for cid, role in keys:
        extra = roles.get(cid)
        out.append((cid, extra if extra and role_rank(extra) > role_rank(role) else role))
    return out


def _spent_last(
    keys: Sequence[str], spent: Callable[[str, float], bool], now: float
) -> tuple[Sequence[str], Collection[str]]:
    """(``keys`` with those whose provider has no request left at ``now`` after the others,
    those)."""
    out = [k for k in keys if spent(k, now)]
    if not out or len(out) == len(keys):
        return keys, out
    return [*(k for k in keys if k not in out), *out], out
