"""How a model is scored (spec "How a model is scored"): pure functions over the catalogue
and the evidence, shared by the ingress (ranking), the chain owners (presets) and the
scoring owner (whether a change of evidence flips an ordering).

Every axis is normalised to [0, 1]. A model without evidence scores an axis 0.5 (neutral,
never best):

- capability: the catalogue's (tier desc, rank asc), dense ranks spread over [0, 1];
- speed: the mean of ``best ttft / ttft`` (streams) and ``tps / best tps`` (every answer),
  over the components the model has evidence for;
- reliability: the EWMA success the scoring owner learned (from a 0.5 prior).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from schemas.catalog import PROFILE_WEIGHTS

if TYPE_CHECKING:
    from schemas.config import ModelConfig
    from schemas.steering import Evidence, ModelEvidence

NEUTRAL = 0.5


def capability_scores(models: Sequence[ModelConfig]) -> dict[str, float]:
    """Capability of each model: 1 for the best (tier, rank), 0 for the worst."""
    keys = sorted({(-m.catalog.tier, m.catalog.rank) for m in models})
    if len(keys) <= 1:
        return {m.id: 1.0 for m in models}
    place = {k: i for i, k in enumerate(keys)}
    last = len(keys) - 1
    return {m.id: 1.0 - place[(-m.catalog.tier, m.catalog.rank)] / last for m in models}


def speed_scores(
    models: Sequence[ModelConfig], evidence: Mapping[str, ModelEvidence]
) -> dict[str, float]:
    """Speed of each model relative to the fastest measured one (neutral without evidence)."""
    ttfts = [e.ttft_ms for m in models if (e := evidence.get(m.id)) and e.ttft_ms]
    tpss = [
        e.tokens_per_second for m in models if (e := evidence.get(m.id)) and e.tokens_per_second
    ]
    best_ttft = min(ttfts) if ttfts else None
    best_tps = max(tpss) if tpss else None
    out: dict[str, float] = {}
    for m in models:
        e = evidence.get(m.id)
        parts: list[float] = []
        if e is not None and e.ttft_ms and best_ttft:
            parts.append(best_ttft / e.ttft_ms)
        if e is not None and e.tokens_per_second and best_tps:
            parts.append(e.tokens_per_second / best_tps)
        out[m.id] = sum(parts) / len(parts) if parts else NEUTRAL
    return out


def reliability_scores(
    models: Sequence[ModelConfig], evidence: Mapping[str, ModelEvidence]
) -> dict[str, float]:
    """Reliability of each model (neutral without evidence)."""
    return {m.id: e.reliability if (e := evidence.get(m.id)) else NEUTRAL for m in models}


def monthly_allowance(model: ModelConfig) -> float | None:
    """The model's monthly free allowance (tokens, else requests), None when it has none."""
    allowance = model.catalog.free_allowance
    if allowance is None:
        return None
    return float(allowance.monthly_tokens or allowance.monthly_requests or 0)


def weighted_score(
    weights: tuple[float, float, float],
    capability: float,
    speed: float,
    reliability: float,
    allowance: float,
    rate_limit: float,
) -> float:
    """A scored ordering's score: the weighted axes times both guardrail multipliers."""
    axes = weights[0] * capability + weights[1] * speed + weights[2] * reliability
    return axes * allowance * rate_limit


def cheapness(model: ModelConfig, evidence: ModelEvidence | None) -> tuple[float, float]:
    """Sort key of ``auto:cheapest``: the most free allowance left first (scaled by the
    rate-limit guardrail), then the lowest price (unpriced last)."""
    remaining = (
        evidence.remaining
        if evidence is not None and evidence.remaining is not None
        else monthly_allowance(model)
    )
    rate = evidence.rate_limit_multiplier if evidence is not None else 1.0
    price = model.catalog.price
    cost = price.input_per_mtok + price.output_per_mtok if price else float("inf")
    return -(remaining or 0.0) * rate, cost


def orderings(
    models: Sequence[ModelConfig],
    evidence: Mapping[str, ModelEvidence],
    weights: Sequence[tuple[float, float, float]],
    capability: Mapping[str, float] | None = None,
) -> tuple[tuple[str, ...], ...]:
    """The enabled models ranked under each of ``weights``, then by cheapness, each with the
    models that cannot serve last: what every scored ordering a view builds follows (a
    chain's is one of these restricted to its members), so a change here flips one.
    ``capability``: the enabled models' :func:`capability_scores`, when the caller keeps it."""
    enabled = [m for m in models if m.catalog.enabled]
    cap = capability if capability is not None else capability_scores(enabled)
    speed = speed_scores(enabled, evidence)
    rel = reliability_scores(enabled, evidence)
    rows = []
    for m in enabled:
        e = evidence.get(m.id)
        allowance, rate = (e.allowance_multiplier, e.rate_limit_multiplier) if e else (1.0, 1.0)
        sick = e is not None and not e.healthy
        rows.append((m.id, sick, cap[m.id], speed[m.id], rel[m.id], allowance, rate, m, e))

    def ranked(key: Callable[[tuple[Any, ...]], Any]) -> tuple[str, ...]:
        return tuple(r[0] for r in sorted(rows, key=lambda r: (r[1], key(r))))

    def by_score(w: tuple[float, float, float]) -> Callable[[tuple[Any, ...]], float]:
        return lambda r: -weighted_score(w, r[2], r[3], r[4], r[5], r[6])

    return (
        *(ranked(by_score(w)) for w in weights),
        ranked(lambda r: cheapness(r[7], r[8])),
    )


def preset_order(
    preset: str, models: Sequence[ModelConfig], evidence: Mapping[str, ModelEvidence]
) -> list[str]:
    """Model ids ranked by ``preset`` (smartest, fastest, biggest_budget), best first; ties
    keep catalogue order. Raises ValueError for an unknown preset."""
    if preset == "smartest":
        cap = capability_scores(models)
        return [m.id for m in sorted(models, key=lambda m: -cap[m.id])]
    if preset == "fastest":
        speed = speed_scores(models, evidence)
        return [m.id for m in sorted(models, key=lambda m: -speed[m.id])]
    if preset == "biggest_budget":
        return [m.id for m in sorted(models, key=lambda m: -(monthly_allowance(m) or -1.0))]
    raise ValueError(f"unknown preset {preset!r}")


_AXIS_WEIGHTS = (
    PROFILE_WEIGHTS["smartest"],
    PROFILE_WEIGHTS["fastest"],
    PROFILE_WEIGHTS["reliable"],
)
"""The orderings every view may follow besides the profile's (a chain's is one of these)."""


def evidence_signature(
    models: Sequence[ModelConfig],
    evidence: Evidence,
    profile: tuple[float, float, float],
    capability: Mapping[str, float] | None = None,
) -> Hashable:
    """What the views' orderings follow in ``evidence``: every scored ordering over the
    catalogue ``models`` (the axes', the ``profile``'s, the cheapest) and the mode."""
    if len(models) < 2:
        return (), evidence.degraded
    by_model = {e.model: e for e in evidence.models}
    ranked = orderings(models, by_model, (*_AXIS_WEIGHTS, profile), capability)
    return ranked, evidence.degraded
