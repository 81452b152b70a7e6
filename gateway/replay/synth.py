"""Synthetic traces: a seeded arrival process and request mix (``llmgw replay synth``).

A synth spec (a scenario's ``synth.yaml``) gives the mean rate and its shape over time
(``poisson``: constant; ``bursty``: ``burst.factor`` times the rate for ``burst.on_seconds``
every ``burst.every_seconds``; ``diurnal``: a sine of ``diurnal.amplitude`` over
``diurnal.period_seconds``), lognormal prompt and output lengths, the share of streams, the
number of callers and labels drawn by weight; the share of requests carrying tool
definitions (and of those, answered by a tool call) and images; the ``max_tokens`` caps
clients set, by share of requests (an answer longer than its cap is cut to it; when any is
given, the other requests set none, else each asks for its answer's length); and the
gateway API keys the callers present, each caller holding one key drawn by weight. The
same spec and seed give the same trace (the tool, image, cap and key draws come from their
own random sources, so a spec without them gives the trace it always gave).
"""

from __future__ import annotations

import math
from random import Random
from typing import TYPE_CHECKING, Literal

import msgspec
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.replay.trace import TraceKey, TraceRequest
from schemas.limits import LimitSpec, parse_budget

if TYPE_CHECKING:
    from pathlib import Path

_Z90 = 1.2815515655446004


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lengths(_Strict):
    """A lognormal token count by its median and 90th percentile, clipped to ``max``."""

    median: int = Field(ge=1)
    p90: int = Field(ge=1)
    max: int = Field(default=200_000, ge=1)

    def draw(self, rng: Random) -> int:
        """One length."""
        sigma = math.log(max(self.p90, self.median) / self.median) / _Z90
        return max(1, min(self.max, round(self.median * math.exp(sigma * rng.gauss(0, 1)))))


class Burst(_Strict):
    """``factor`` times the base rate for ``on_seconds`` out of every ``every_seconds``."""

    factor: float = Field(default=4.0, ge=1)
    on_seconds: float = Field(default=10.0, gt=0)
    every_seconds: float = Field(default=60.0, gt=0)


class Diurnal(_Strict):
    """The rate times ``1 + amplitude * sin(2 pi t / period_seconds)``."""

    amplitude: float = Field(default=0.5, ge=0, le=1)
    period_seconds: float = Field(default=86_400.0, gt=0)


class Tools(_Strict):
    """``share`` of the requests send ``count`` function definitions; ``call_share`` of those
    ask for a tool call as their answer (``tool_choice: required``)."""

    share: float = Field(default=0.0, ge=0, le=1)
    count: int = Field(default=3, ge=1, le=128)
    call_share: float = Field(default=0.5, ge=0, le=1)


class Images(_Strict):
    """``share`` of the requests carry ``count`` images after their text."""

    share: float = Field(default=0.0, ge=0, le=1)
    count: int = Field(default=1, ge=1, le=16)


class KeyLimits(_Strict):
    """A key's limits, as ``llmgw keys create`` takes them (``budget``: ``USD/period``)."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    budget: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> KeyLimits:
        self.spec()  # raises ValueError naming what is wrong
        return self

    def spec(self) -> LimitSpec:
        """The LimitSpec these limits stand for. Raises ValueError."""
        usd, period = parse_budget(self.budget) if self.budget is not None else (None, "month")
        spec = LimitSpec(
            rpm=self.rpm,
            tpm=self.tpm,
            concurrency=self.concurrency,
            budget_usd=usd,
            budget_period=period,
        )
        problems = spec.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return spec


class Key(_Strict):
    """A gateway API key: callers hold it in proportion to ``weight``."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    weight: float = Field(default=1.0, gt=0)
    role: Literal["free", "pro", "internal", "admin"] = "free"
    org: str = Field(default="replay", min_length=1, max_length=64)
    limits: KeyLimits | None = None

    def trace_key(self) -> TraceKey:
        """The trace's declaration of this key."""
        limits = self.limits.spec() if self.limits is not None else None
        return TraceKey(name=self.name, role=self.role, org=self.org, limits=limits)


class SynthSpec(_Strict):
    """How to make a trace (see the module docstring)."""

    model: str
    rate: float = Field(gt=0, description="mean requests per second")
    duration_seconds: float = Field(gt=0)
    arrival: Literal["poisson", "bursty", "diurnal"] = "poisson"
    burst: Burst = Burst()
    diurnal: Diurnal = Diurnal()
    prompt_tokens: Lengths = Lengths(median=400, p90=2000)
    output_tokens: Lengths = Lengths(median=150, p90=500)
    stream_share: float = Field(default=1.0, ge=0, le=1)
    callers: int = Field(default=100, ge=1)
    labels: dict[str, dict[str, float]] = Field(default_factory=dict)
    tools: Tools = Tools()
    images: Images = Images()
    max_tokens: dict[int, float] = Field(default_factory=dict)
    keys: tuple[Key, ...] = ()

    @model_validator(mode="after")
    def _caps_shared_once(self) -> SynthSpec:
        if any(cap < 1 or share < 0 for cap, share in self.max_tokens.items()):
            raise ValueError("max_tokens: each cap is at least 1 and its share at least 0")
        if sum(self.max_tokens.values()) > 1.0 + 1e-9:
            raise ValueError("max_tokens: the shares add up to more than 1")
        return self

    @model_validator(mode="after")
    def _keys_named_once(self) -> SynthSpec:
        names = [k.name for k in self.keys]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"keys: {name!r} is declared twice")
        return self

    def trace_keys(self) -> list[TraceKey]:
        """The keys the trace declares (see :class:`~gateway.replay.trace.TraceKey`)."""
        return [k.trace_key() for k in self.keys]

    def shape(self, t: float) -> float:
        """The rate's multiplier at ``t`` (its largest value is :meth:`peak`)."""
        if self.arrival == "bursty":
            b = self.burst
            return b.factor if t % b.every_seconds < b.on_seconds else 1.0
        if self.arrival == "diurnal":
            d = self.diurnal
            return 1.0 + d.amplitude * math.sin(2 * math.pi * t / d.period_seconds)
        return 1.0

    def peak(self) -> float:
        """The largest multiplier :meth:`shape` reaches."""
        if self.arrival == "bursty":
            return self.burst.factor
        if self.arrival == "diurnal":
            return 1.0 + self.diurnal.amplitude
        return 1.0


def load_synth(path: str | Path) -> SynthSpec:
    """Read a synth spec. Raises OSError, yaml.YAMLError, ValidationError."""
    with open(path, encoding="utf-8") as fh:
        return SynthSpec.model_validate(yaml.safe_load(fh))


def synthesize(
    spec: SynthSpec, seed: int, *, duration_seconds: float | None = None
) -> list[TraceRequest]:
    """The trace ``spec`` describes (``duration_seconds`` overrides its length), arrivals by
    thinning a Poisson process at the peak rate."""
    rng = Random(f"synth:{seed}")
    mix = _Mix(spec, seed)
    duration = duration_seconds or spec.duration_seconds
    peak = spec.rate * spec.peak()
    out: list[TraceRequest] = []
    t = rng.expovariate(peak)
    while t < duration:
        if rng.random() * spec.peak() < spec.shape(t):
            out.append(mix.dress(_request(spec, rng, len(out), t)))
        t += rng.expovariate(peak)
    return out


def _request(spec: SynthSpec, rng: Random, n: int, t: float) -> TraceRequest:
    labels = {name: _pick(rng, weights) for name, weights in sorted(spec.labels.items())}
    return TraceRequest(
        id=f"r{n}",
        t=round(t, 6),
        model=spec.model,
        prompt_tokens=spec.prompt_tokens.draw(rng),
        output_tokens=spec.output_tokens.draw(rng),
        stream=rng.random() < spec.stream_share,
        caller=f"c{rng.randrange(spec.callers)}",
        labels=labels,
    )


class _Mix:
    """What a request carries besides its size: tools, images, its ``max_tokens`` cap and its
    caller's key, drawn from random sources of their own."""

    def __init__(self, spec: SynthSpec, seed: int) -> None:
        self._spec = spec
        self._rng = Random(f"synth:{seed}:mix")
        self._caps = Random(f"synth:{seed}:caps")
        weights = {k.name: k.weight for k in spec.keys}
        keys = Random(f"synth:{seed}:keys")
        self._key_of = [_pick(keys, weights) for _ in range(spec.callers)] if weights else []

    def dress(self, r: TraceRequest) -> TraceRequest:
        spec, rng = self._spec, self._rng
        changes: dict[str, object] = {}
        if spec.tools.share and rng.random() < spec.tools.share:
            changes["tools"] = spec.tools.count
            changes["tool_call"] = rng.random() < spec.tools.call_share
        if spec.images.share and rng.random() < spec.images.share:
            changes["images"] = spec.images.count
        if self._key_of:
            changes["key"] = self._key_of[int(r.caller[1:])]
        if spec.max_tokens:
            changes["max_tokens"] = 0  # unless a cap is drawn: the client sets none
            x = self._caps.random()
            for cap, share in sorted(spec.max_tokens.items()):
                x -= share
                if x < 0:
                    changes["max_tokens"] = cap
                    changes["output_tokens"] = min(r.output_tokens, cap)
                    break
        return msgspec.structs.replace(r, **changes) if changes else r


def _pick(rng: Random, weights: dict[str, float]) -> str:
    names = sorted(weights)
    x = rng.random() * sum(weights.values())
    for name in names:
        x -= weights[name]
        if x < 0:
            return name
    return names[-1]
