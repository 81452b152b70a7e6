"""The providers file: how each simulated upstream behaves (never what it costs).

One entry per route, matched by endpoint id (``m:p1``) or base URL. Prices come from each
compared config's route ``pricing:``, so two configs that price differently are compared as
their operator would be billed. Times are seconds; ``at``/``start``/``end`` count from the
trace's first arrival.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from pathlib import Path

_Z90 = 1.2815515655446004  # the standard normal's 90th percentile


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ttft(_Strict):
    """Time to first token, lognormal by its median and 90th percentile, unloaded; each
    thousand prompt tokens adds ``per_1k_prompt`` seconds to the median."""

    median: float = Field(gt=0)
    p90: float = Field(gt=0)
    per_1k_prompt: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Ttft:
        if self.p90 < self.median:
            raise ValueError("ttft.p90 must be at least ttft.median")
        return self

    @property
    def sigma(self) -> float:
        """The lognormal's shape parameter."""
        return math.log(self.p90 / self.median) / _Z90


class RateLimit(_Strict):
    """At most ``requests`` (and ``tokens``: prompt plus output) per ``per_seconds``: in any
    sliding window of that length (``kind: window``), or taken from a bucket of that many that
    refills evenly over it (``kind: bucket``, as OpenAI and Anthropic meter); beyond, a 429
    with ``Retry-After`` (``retry_after``, else the time until the window frees or one request
    refills) and the ``x-ratelimit-*`` headers."""

    requests: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=1)
    per_seconds: float = Field(default=60.0, gt=0)
    retry_after: float | None = Field(default=None, ge=0)
    kind: Literal["window", "bucket"] = "window"
    # Output metered apart, as Anthropic does (a bucket only): ``tokens`` is then the input
    # limit; answers report the two apart (``report_apart``) or only their sum.
    output_tokens: int | None = Field(default=None, ge=1)
    report_apart: bool = True

    @model_validator(mode="after")
    def _output_apart_in_a_bucket(self) -> RateLimit:
        if self.output_tokens is not None and (self.kind != "bucket" or self.tokens is None):
            raise ValueError("rate_limit.output_tokens needs kind: bucket and tokens (input)")
        return self


class ErrorRates(_Strict):
    """Per attempt probabilities of each failure kind (drawn before anything is sent back)."""

    http_500: float = Field(default=0.0, ge=0, le=1)
    http_503: float = Field(default=0.0, ge=0, le=1)
    reset: float = Field(default=0.0, ge=0, le=1)
    stall: float = Field(default=0.0, ge=0, le=1)
    empty: float = Field(default=0.0, ge=0, le=1)
    http_401: float = Field(default=0.0, ge=0, le=1)
    http_403: float = Field(default=0.0, ge=0, le=1)  # last: earlier kinds keep their draws


class QuotaPlan(_Strict):
    """A subscription's allowance: ``requests`` and/or ``tokens`` (prompt plus output) per
    ``period_seconds`` (a day), counted per credential in periods from the trace's start;
    once spent, every attempt is a 429 ``insufficient_quota`` until the next period."""

    requests: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=1)
    period_seconds: float = Field(default=86_400.0, gt=0)

    @model_validator(mode="after")
    def _bounded(self) -> QuotaPlan:
        if self.requests is None and self.tokens is None:
            raise ValueError("quota needs requests or tokens (or both) per period_seconds")
        return self


class ConcurrencyPlan(_Strict):
    """A plan allowing ``limit`` requests in flight per credential: one more is refused at
    once with a 429 (``Retry-After: retry_after`` when set)."""

    limit: int = Field(ge=1)
    retry_after: float | None = Field(default=None, ge=0)


class Outage(_Strict):
    """A window in which every attempt fails the same way (``connect``: refused; ``http_503``;
    ``stall``: accepted, never answers)."""

    start: float = Field(ge=0)
    end: float = Field(gt=0)
    kind: Literal["connect", "http_503", "stall"] = "connect"
    errors: ErrorRates | None = None
    """Instead of failing every attempt: these error rates during the window (a flaky burst)."""


class Drift(_Strict):
    """From ``at`` the TTFT is multiplied by ``factor``, reached linearly over ``ramp``."""

    at: float = Field(ge=0)
    factor: float = Field(gt=0)
    ramp: float = Field(default=0.0, ge=0)


class Provider(_Strict):
    """One simulated upstream route."""

    endpoint: str | None = None
    base_url: str | None = None
    ttft: Ttft
    output_tps: float = Field(default=50.0, gt=0)
    capacity: int | None = Field(default=None, ge=1)
    """Requests served at once; more wait in a FIFO queue (their TTFT grows with it)."""
    rate_limit: RateLimit | None = None
    quota: QuotaPlan | None = None
    concurrency: ConcurrencyPlan | None = None
    refused_keys: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    """Credentials answered 403 on every attempt: as the config writes them, or their id
    (``k-…``, as events and logs show them)."""
    errors: ErrorRates = ErrorRates()
    outages: tuple[Outage, ...] = ()
    drift: tuple[Drift, ...] = ()

    @model_validator(mode="after")
    def _named(self) -> Provider:
        if not (self.endpoint or self.base_url):
            raise ValueError("a provider needs an endpoint id or a base_url")
        return self

    def ttft_factor(self, t: float) -> float:
        """The drift multiplier at ``t`` seconds into the trace."""
        factor = 1.0
        for d in self.drift:
            if t >= d.at + d.ramp:
                factor *= d.factor
            elif t > d.at:
                factor *= 1.0 + (d.factor - 1.0) * (t - d.at) / d.ramp
        return factor

    def outage_at(self, t: float) -> Outage | None:
        """The outage window covering ``t``, if any."""
        return next((o for o in self.outages if o.start <= t < o.end), None)


class ProvidersFile(_Strict):
    """The whole providers file: the routes' behaviour and the SLO reports count against."""

    providers: tuple[Provider, ...]
    slo_ttft_seconds: float = Field(default=3.0, gt=0)

    def for_route(self, endpoint: str, base_url: str) -> Provider | None:
        """The provider describing the route ``endpoint`` (or its ``base_url``)."""
        for p in self.providers:
            if p.endpoint == endpoint:
                return p
        for p in self.providers:
            if p.base_url and p.base_url.rstrip("/") == base_url.rstrip("/"):
                return p
        return None


def load_providers(path: str | Path) -> ProvidersFile:
    """Read and validate a providers file. Raises OSError, yaml.YAMLError, ValidationError."""
    with open(path, encoding="utf-8") as fh:
        return ProvidersFile.model_validate(yaml.safe_load(fh))
