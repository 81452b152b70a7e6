"""KeyQuota: the free allowance left on each credential of a model, this calendar month (UTC),
for ``credential_choice: least_remaining_quota``.

Owned by the ModelActor (its observations say which credential each attempt spent; every
attempt sent upstream counts once: one request plus its prompt and completion tokens) and
persisted in its snapshot. :meth:`preference` ranks credentials for the key pools: those
with allowance left, least left first (use it before it resets), then those without a
declared allowance, then the used-up ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from actors.state.scoring import month_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from schemas import Observation
    from schemas.catalog import AllowanceConfig

_REFUSALS = ("key_pool_exhausted", "key_pool_role_restricted")
_USED_UP = float("inf")  # after the keys without an allowance (the pools rank those 1e300)


class KeyUsage(msgspec.Struct):
    """One credential's usage in ``month`` (persisted)."""

    month: str = ""
    tokens: int = 0
    requests: int = 0


class KeyQuota:
    """Owns the monthly usage of a model's credentials that declare a free allowance."""

    def __init__(self, allowances: Mapping[str, AllowanceConfig]) -> None:
        self._allowances = dict(allowances)
        self._usage: dict[str, KeyUsage] = {}

    def restore(self, usage: Mapping[str, KeyUsage]) -> None:
        """Take persisted usage for the credentials still declared."""
        self._usage = {c: u for c, u in usage.items() if c in self._allowances}

    def snapshot(self) -> dict[str, KeyUsage]:
        """What must outlive a restart."""
        return dict(self._usage)

    def learn(self, obs: Observation, now: float) -> bool:
        """Count one attempt; True when a declared allowance moved."""
        cid = obs.credential_id
        if (
            cid not in self._allowances
            or obs.outcome == "cancelled"
            or (obs.error_kind in _REFUSALS)
        ):
            return False
        month = month_of(now)
        use = self._usage.get(cid)
        if use is None or use.month != month:
            use = self._usage[cid] = KeyUsage(month=month)
        use.requests += 1
        use.tokens += obs.prompt_tokens + obs.completion_tokens
        return True

    def remaining(self, cid: str, now: float) -> float | None:
        """What is left of ``cid``'s allowance this month (tokens, else requests); None when
        it declares none."""
        allowance = self._allowances.get(cid)
        if allowance is None:
            return None
        use = self._usage.get(cid)
        tokens, requests = (
            (use.tokens, use.requests) if use and use.month == month_of(now) else (0, 0)
        )
        if allowance.monthly_tokens:
            left = allowance.monthly_tokens - tokens
            if allowance.monthly_requests:
                left = min(left, allowance.monthly_requests - requests)
            return float(max(left, 0))
        return float(max((allowance.monthly_requests or 0) - requests, 0))

    def preference(self, now: float) -> dict[str, float]:
        """A sort key per credential: lower is spent first (see the module docstring)."""
        out: dict[str, float] = {}
        for cid in self._allowances:
            left = self.remaining(cid, now)
            out[cid] = _USED_UP if left == 0 else (left or 0.0)
        return out
