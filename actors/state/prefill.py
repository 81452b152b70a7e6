"""Prefill load: un-cached prompt tokens in prefill per endpoint (pure state).

Spec "Prefill-aware selection": a lease is taken when a request is routed to an endpoint and
released at its first token (or when the attempt ends or is abandoned before it). The
un-cached size of a prompt is estimated from the caller's last completed prompt on that
endpoint, so a warm continuation is not mistaken for a cold mega-prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

_SWEEP_EVERY = 1024  # acquisitions (or hints) between sweeps of leases and stale hints
HINTS_MAX = 100_000
"""(caller, endpoint) hints kept: callers are affinity keys, so a client's addresses or grant
headers make them; past this the oldest hint goes first."""


@dataclass(slots=True)
class _Lease:
    endpoint: str
    tokens: int
    elephant: bool
    expires: float


class PrefillLoad:
    """Owns the prefill backlog and elephant counts of one model's endpoints."""

    def __init__(self, *, elephant_tokens: int, hint_ttl: float, lease_ttl: float = 600.0) -> None:
        self.elephant_tokens = elephant_tokens
        self.hint_ttl = hint_ttl
        self.lease_ttl = lease_ttl
        self._backlog: dict[str, int] = {}
        self._elephants: dict[str, int] = {}
        self._leases: dict[str, _Lease] = {}
        self._hints: dict[tuple[str, str], tuple[int, float]] = {}
        self._acquired = 0
        self._remembered = 0

    @property
    def hint_count(self) -> int:
        """(caller, endpoint) hints held now (stale ones until the next sweep)."""
        return len(self._hints)

    def backlog(self, endpoint: str) -> int:
        """Un-cached prompt tokens currently in prefill on ``endpoint``."""
        return self._backlog.get(endpoint, 0)

    def elephants(self, endpoint: str) -> int:
        """Elephant prompts currently in prefill on ``endpoint``."""
        return self._elephants.get(endpoint, 0)

    def uncached(self, caller: str, endpoint: str, prompt_tokens: int, now: float) -> int:
        """Estimated un-cached tokens of this prompt on ``endpoint`` for ``caller``."""
        hint = self._hints.get((caller, endpoint)) if caller else None
        if hint is None or hint[1] <= now:
            return prompt_tokens
        return max(0, prompt_tokens - hint[0])

    def is_elephant(self, tokens: int) -> bool:
        """Whether an un-cached size counts as an elephant."""
        return tokens >= self.elephant_tokens

    def acquire(self, request_id: str, endpoint: str, tokens: int, now: float) -> None:
        """Lease ``tokens`` of prefill on ``endpoint`` for ``request_id``."""
        if not request_id or tokens <= 0:
            return
        self._acquired += 1
        if self._acquired % _SWEEP_EVERY == 0:
            self.expire(now)
        self.release(request_id)
        elephant = self.is_elephant(tokens)
        self._leases[request_id] = _Lease(endpoint, tokens, elephant, now + self.lease_ttl)
        self._backlog[endpoint] = self._backlog.get(endpoint, 0) + tokens
        if elephant:
            self._elephants[endpoint] = self._elephants.get(endpoint, 0) + 1

    def release(self, request_id: str) -> bool:
        """Release ``request_id``'s lease (idempotent); True if there was one."""
        lease = self._leases.pop(request_id, None)
        if lease is None:
            return False
        self._backlog[lease.endpoint] = max(0, self._backlog.get(lease.endpoint, 0) - lease.tokens)
        if lease.elephant:
            self._elephants[lease.endpoint] = max(0, self._elephants.get(lease.endpoint, 0) - 1)
        return True

    def remember(self, caller: str, endpoint: str, prompt_tokens: int, now: float) -> None:
        """Record a completed prompt's size for the (caller, endpoint) hint."""
        if not caller or prompt_tokens <= 0:
            return
        # Swept here too, not only on acquisitions: with prefill off (or every prompt
        # cached) none is taken, and the hints of callers gone would stay for ever.
        self._remembered += 1
        if self._remembered % _SWEEP_EVERY == 0:
            self.expire(now)
        hints = self._hints
        hints.pop((caller, endpoint), None)  # re-inserted: the oldest stays first
        hints[(caller, endpoint)] = (prompt_tokens, now + self.hint_ttl)
        if len(hints) > HINTS_MAX:
            del hints[next(iter(hints))]

    def expire(self, now: float) -> None:
        """Drop leases whose owner never reported back (a lost ingress) and stale hints."""
        for rid in [r for r, lease in self._leases.items() if lease.expires <= now]:
            self.release(rid)
        for key in [k for k, (_, exp) in self._hints.items() if exp <= now]:
            del self._hints[key]
