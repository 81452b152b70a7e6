"""EvidenceBook: the scoring evidence one owner (the SteeringActor) learns from observations.

Per public model: EWMA time to first token (streams), EWMA output tokens per second (every
answer), EWMA success of its attempts (from a neutral 0.5 prior; a rate-limit answer is
none), the time of its last rate-limit answer (back-pressure: a 429 that is not a quota
exhaustion), its free-allowance usage this calendar month (UTC; every attempt sent upstream
counts once: one request plus its prompt and completion tokens) and whether any of its routes
can serve (from EndpointState events). Pure state: the owner feeds it and persists
:meth:`snapshot`.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from schemas import (
    EndpointState,
    Evidence,
    Guardrails,
    ModelEvidence,
    Observation,
    is_backpressure,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas.config import ModelConfig

_ALPHA = 0.2
_REFUSALS = ("key_pool_exhausted", "key_pool_role_restricted")


def month_of(now: float) -> str:
    """The calendar month (UTC) of ``now``: ``2026-12``."""
    start, end, label = _last_month[0]
    if start <= now < end:  # every observation asks: formatting a date each time is not free
        return label
    t = time.gmtime(now)
    label = time.strftime("%Y-%m", t)
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    end = calendar.timegm((t.tm_year + t.tm_mon // 12, t.tm_mon % 12 + 1, 1, 0, 0, 0))
    _last_month[0] = (start, end, label)
    return label


# The month last asked for, as [start, end) in epoch seconds and its label (a replay's clock
# may go anywhere: any other time is computed again).
_last_month: list[tuple[float, float, str]] = [(0.0, 0.0, "")]


class ModelRecord(msgspec.Struct):
    """What is known about one model (persisted)."""

    ttft_ms: float | None = None
    tps: float | None = None
    reliability: float = 0.5
    attempts: int = 0
    last_429: float | None = None
    month: str = ""
    tokens: int = 0
    requests: int = 0


class BookSnapshot(msgspec.Struct):
    """The persisted form of an EvidenceBook."""

    models: dict[str, ModelRecord] = {}


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


@dataclass(slots=True)
class _Usable:
    closed: bool
    benched_until: float | None


class EvidenceBook:
    """Owns the evidence of every catalogue model (see the module docstring)."""

    def __init__(self, catalogue: Sequence[ModelConfig]) -> None:
        self._catalogue = {m.id: m for m in catalogue}
        self._records: dict[str, ModelRecord] = {m.id: ModelRecord() for m in catalogue}
        self._routes: dict[str, dict[str, _Usable]] = {m.id: {} for m in catalogue}

    def restore(self, snap: BookSnapshot) -> None:
        """Take the records of a snapshot for the models still in the catalogue."""
        for model, record in snap.models.items():
            if model in self._records:
                self._records[model] = record

    def snapshot(self) -> BookSnapshot:
        """What must outlive a restart."""
        return BookSnapshot(models=dict(self._records))

    def learn(self, obs: Observation, now: float) -> bool:
        """Learn from one attempt; True when something changed."""
        rec = self._records.get(obs.model)
        if rec is None or obs.outcome == "cancelled" or obs.error_kind in _REFUSALS:
            return False
        self._count_usage(rec, obs, now)
        # The same back-pressure signal that cools a credential: a quota or billing exhaustion
        # is no pace to slow down to (its key is muted), and a refusal sent nothing.
        # It is the rate-limit penalty's alone: a pace, not unreliability (nor, as for the
        # circuit and the bench, sickness).
        if is_backpressure(obs):
            rec.last_429 = now
        elif obs.outcome in ("success", "failure"):
            rec.attempts += 1
            rec.reliability = rec.reliability + _ALPHA * (
                (1.0 if obs.outcome == "success" else 0.0) - rec.reliability
            )
        if obs.outcome == "success":
            if obs.stream and obs.ttft_ms is not None:
                rec.ttft_ms = _ewma(rec.ttft_ms, max(obs.ttft_ms, 0.01))
            if obs.completion_tokens > 0 and obs.latency_ms > 0:
                rec.tps = _ewma(rec.tps, obs.completion_tokens / (obs.latency_ms / 1000))
        return True

    @staticmethod
    def _count_usage(rec: ModelRecord, obs: Observation, now: float) -> None:
        month = month_of(now)
        if rec.month != month:
            rec.month, rec.tokens, rec.requests = month, 0, 0
        rec.requests += 1
        rec.tokens += obs.prompt_tokens + obs.completion_tokens

    def endpoint(self, st: EndpointState) -> bool:
        """Note an endpoint's circuit and bench; True when its model is in the catalogue."""
        routes = self._routes.get(st.model)
        if routes is None:
            return False
        routes[st.endpoint] = _Usable(st.circuit_state == "closed", st.benched_until)
        return True

    def decaying(self, guardrails: Guardrails, now: float) -> bool:
        """Whether some rate-limit penalty is still wearing off."""
        decay = guardrails.rate_limit_decay_seconds
        return any(
            r.last_429 is not None and now - r.last_429 < decay for r in self._records.values()
        )

    def evidence(self, guardrails: Guardrails, now: float, *, degraded: bool, seq: int) -> Evidence:
        """Every model's evidence with the guardrail multipliers as of ``now``."""
        month = month_of(now)
        out = []
        for model_id, rec in self._records.items():
            tokens, requests = (rec.tokens, rec.requests) if rec.month == month else (0, 0)
            used, remaining = self._allowance(self._catalogue[model_id], tokens, requests)
            out.append(
                ModelEvidence(
                    model=model_id,
                    ttft_ms=rec.ttft_ms,
                    tokens_per_second=rec.tps,
                    reliability=rec.reliability,
                    attempts=rec.attempts,
                    tokens_used=tokens,
                    requests_used=requests,
                    remaining=remaining,
                    allowance_used=used,
                    allowance_multiplier=allowance_multiplier(used, guardrails),
                    rate_limit_multiplier=rate_limit_multiplier(rec.last_429, now, guardrails),
                    healthy=self._healthy(model_id, now),
                )
            )
        return Evidence(models=tuple(out), degraded=degraded, month=month, ts=now, seq=seq)

    @staticmethod
    def _allowance(
        model: ModelConfig, tokens: int, requests: int
    ) -> tuple[float | None, float | None]:
        """(share used, what remains) of the model's monthly allowance; (None, None) without."""
        allowance = model.catalog.free_allowance
        if allowance is None:
            return None, None
        shares = []
        if allowance.monthly_tokens:
            shares.append(tokens / allowance.monthly_tokens)
        if allowance.monthly_requests:
            shares.append(requests / allowance.monthly_requests)
        remaining = (
            allowance.monthly_tokens - tokens
            if allowance.monthly_tokens
            else (allowance.monthly_requests or 0) - requests
        )
        return max(shares), float(max(remaining, 0))

    def _healthy(self, model_id: str, now: float) -> bool:
        routes = self._routes[model_id].values()
        if not routes:
            return True  # nothing heard yet: usable until a state says otherwise
        return any(r.closed and (r.benched_until is None or r.benched_until <= now) for r in routes)


def allowance_multiplier(used: float | None, g: Guardrails) -> float:
    """1 below ``allowance_threshold`` of the allowance used, falling linearly to
    ``allowance_floor`` at 100 % (and staying there)."""
    if used is None or used < g.allowance_threshold:
        return 1.0
    if used >= 1.0 or g.allowance_threshold >= 1.0:
        return g.allowance_floor
    span = 1.0 - g.allowance_threshold
    return 1.0 - (1.0 - g.allowance_floor) * (used - g.allowance_threshold) / span


def rate_limit_multiplier(last_429: float | None, now: float, g: Guardrails) -> float:
    """``rate_limit_penalty`` right after a 429, back to 1 linearly over the decay time."""
    if last_429 is None:
        return 1.0
    age = max(0.0, now - last_429)
    if age >= g.rate_limit_decay_seconds:
        return 1.0
    return g.rate_limit_penalty + (1.0 - g.rate_limit_penalty) * age / g.rate_limit_decay_seconds
