"""Steering configuration (spec gateway-routing "Steering one request", "Named chains", "How a
model is scored"): a model's ``catalog:`` entry, the top-level ``chains:`` list and the
``steering:`` section, as pydantic models (unknown keys refused).

The grammar of the model field lives here too, so the config, the chain owners and the
ingress agree on it: ``auto``, ``auto:<axis>`` (or a synonym), ``auto:<chain>``, all
case-insensitive. A chain may not be named like an axis or a synonym.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from schemas.names import shown
from schemas.process_config import Strict

AUTO = "auto"
AXES = ("smartest", "fastest", "cheapest", "reliable")
"""The axis ids a client may name as ``auto:<axis>`` (``GET /v1/models`` lists these)."""
AXIS_SYNONYMS = {
    "smartest": "smartest",
    "smart": "smartest",
    "fastest": "fastest",
    "fast": "fastest",
    "speed": "fastest",
    "cheapest": "cheapest",
    "cheap": "cheapest",
    "budget": "cheapest",
    "reliable": "reliable",
}
"""Every name ``auto:<name>`` may use for an axis, lower case, to the axis it means."""
PROFILES = ("balanced", "smartest", "fastest", "reliable", "custom", "priority")
PROFILE_WEIGHTS = {
    "balanced": (0.5, 0.25, 0.25),
    "smartest": (1.0, 0.0, 0.0),
    "fastest": (0.0, 1.0, 0.0),
    "reliable": (0.0, 0.0, 1.0),
}
"""(capability, speed, reliability) weights of each built-in scored profile."""
PRESETS = ("smartest", "fastest", "biggest_budget")
_CHAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """``text`` with only A-Z lower-cased: steering ids and chain names compare ASCII
    case-insensitively, so no Unicode folding makes a name another (the Kelvin sign K
    lower-cases to k)."""
    return text.translate(_ASCII_LOWER)


def chain_name_problem(name: str) -> str | None:
    """Why ``name`` (already lower case) cannot name a chain, or None when it can."""
    if not _CHAIN_NAME.match(name):
        return (
            f"chain name {shown(name)} must be 1-64 of a-z, 0-9, '_' and '-', starting with a "
            "letter or digit"
        )
    if name == AUTO or name in AXIS_SYNONYMS:
        return f"chain name {name!r} is taken by an axis (auto:{name} ranks on it)"
    return None


def weights_problem(weights: tuple[float, float, float]) -> str | None:
    """Why custom ``weights`` are refused (each in [0, 1], summing to one), or None."""
    if len(weights) != 3 or any(not 0 <= w <= 1 for w in weights):
        return "weights must be three numbers in [0, 1]: capability, speed, reliability"
    if not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
        return f"weights must sum to 1 (they sum to {sum(weights):g})"
    return None


class PriceConfig(Strict):
    """What a model costs, per million tokens."""

    input_per_mtok: float = Field(default=0.0, ge=0)
    output_per_mtok: float = Field(default=0.0, ge=0)


class AllowanceConfig(Strict):
    """A monthly free allowance (calendar month, UTC): tokens, requests, or both."""

    monthly_tokens: int | None = Field(default=None, gt=0)
    monthly_requests: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some_limit(self) -> AllowanceConfig:
        if self.monthly_tokens is None and self.monthly_requests is None:
            raise ValueError("free_allowance needs monthly_tokens or monthly_requests")
        return self


class CatalogConfig(Strict):
    """A model's catalogue entry. Defaults are neutral: tier 1, rank 1, no price (it ranks
    after priced models on ``auto:cheapest``), no free allowance."""

    tier: int = Field(default=1, ge=0)
    rank: int = Field(default=1, ge=1)
    price: PriceConfig | None = None
    free_allowance: AllowanceConfig | None = None
    enabled: bool = True


class ChainModelConfig(Strict):
    """One position of a chain."""

    model: str = Field(min_length=1)
    enabled: bool = True


class ChainConfig(Strict):
    """A named chain declared in the config (admin commands may change it afterwards)."""

    name: str
    org: str | None = None
    backfill: bool = False
    models: tuple[str | ChainModelConfig, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        v = v.strip().lower()
        problem = chain_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    def entries(self) -> tuple[ChainModelConfig, ...]:
        """The chain's positions, strings read as enabled models."""
        return tuple(ChainModelConfig(model=m) if isinstance(m, str) else m for m in self.models)


class GuardrailsConfig(Strict):
    """The two multipliers every scored ordering applies (spec "Guardrails and settings")."""

    allowance_threshold: float = Field(default=0.8, ge=0, le=1)
    allowance_floor: float = Field(default=0.2, ge=0, le=1)
    rate_limit_penalty: float = Field(default=0.5, ge=0, le=1)
    rate_limit_decay_seconds: float = Field(default=300.0, gt=0)


class SteeringConfig(Strict):
    """How ``auto`` is steered: the active chain, the scoring profile, guardrails and the
    exploration probability."""

    active_chain: str | None = None
    profile: Literal["balanced", "smartest", "fastest", "reliable", "custom", "priority"] = (
        "balanced"
    )
    weights: tuple[float, float, float] | None = None
    guardrails: GuardrailsConfig = GuardrailsConfig()
    exploration: float = Field(default=0.05, ge=0, le=1)

    @field_validator("active_chain")
    @classmethod
    def _lower(cls, v: str | None) -> str | None:
        return v.strip().lower() if v is not None else None

    @model_validator(mode="after")
    def _custom_weights(self) -> SteeringConfig:
        if self.profile == "custom":
            if self.weights is None:
                raise ValueError("profile custom needs weights: [capability, speed, reliability]")
            problem = weights_problem(self.weights)
            if problem:
                raise ValueError(problem)
        elif self.weights is not None:
            raise ValueError("weights are only read with profile: custom")
        return self
