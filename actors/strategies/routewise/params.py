"""``router_params:`` of ``router: routewise``: the algorithm knobs, field for field.

The keys and defaults follow the spec's ``RouteWiseConfig`` (cost-budget interpolation,
latency SLO and window, cost-envelope percentiles/window/minimum samples/donor models,
output-length predictor, prober, hedging mode, fallback mode, prefix-cache flag). Resource
limits are route-level configuration now (``provider_type``, ``pricing:``, ``quota:``,
``quota_source:``, ``concurrency:``); the keys that used to carry them here are refused with
the name of their replacement, so a stale registry fails loudly instead of being ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from actors.strategies.base import StrategyParams
from schemas.pricing import Pricing

# Old router_params key -> where that setting lives now.
RESOURCE_KEYS: dict[str, str] = {
    "daily_quota": "route `quota: {limit}` with `quota_source: {kind: local, window: daily}`",
    "quota_limit": "route `quota: {limit}`",
    "quota_size": "route `quota: {limit}`",
    "quota_window_sec": "route `quota_source: {kind: local, window: <seconds>}`",
    "quota_monthly_fee": "route `pricing:`",
    "reset_timezone": "route `quota_source: {kind: local, timezone}`",
    "quota_snapshot_refresh_interval_sec": "route `quota_source: {kind: http_json, "
    "refresh_seconds}`",
    "concurrency_enabled": "route `provider_type: concurrency`",
    "concurrency_limit": "route `concurrency: {limit}`",
    "concurrency_monthly_fee": "route `pricing:`",
    "stateful_providers_single_worker_only": "nothing: quota and concurrency are owned by one "
    "actor per pool, exact across ingress processes",
}


class RouteWiseParams(StrategyParams):
    """Algorithm parameters of one RouteWise model (spec "RouteWise").

    - ``budget_alpha``: the LP's cost budget is ``c_min + alpha * (c_fast - c_min)`` over the
      feasible candidates' effective costs (``c_fast`` the fastest one's): 0 buys the
      cheapest mix, 1 the fastest.
    - ``reference_api_price``: prices the cost envelope (what one request would cost on an
      on-demand API); default: the cheapest priced on-demand route of the model.
    - ``envelope_*``: the rolling distribution of request costs whose percentiles are the
      quota shadow price's floor ``L`` and ceiling ``U``; ``envelope_bootstrap_donor_models``
      also replay these models' request-log rows into this model's envelope at startup.
    - ``latency_*``: the TTFT profile window (``latency_window_sec``), the older history used
      as a prior when that window is empty, the estimate of a never-measured route, the SLO
      the hedging checkpoints are placed on, and ``latency_hedge_mode``; the fast mean of the
      last seconds (``latency_fast_half_life_sec``, 0 for the window alone) blended with the
      window, which weighs ``latency_fast_prior_samples`` samples; once a route had no attempt
      for ``latency_failure_idle_sec`` (0: never), its failures so far stop weighing, so the
      LP tries a route it left for them again on its successes' evidence.
    - ``output_*``: the output-length predictor (prompt-size bucket, then the model, then the
      model with its donors' rows; ``output_default_tokens`` before any evidence).
    - ``fallback_mode``: ``policy`` re-solves without a failed route (the plan's order);
      ``strict`` sends one route only.
    - ``routewise_probe_*``: the active prober of idle or cold routes.
    """

    budget_alpha: float = Field(default=0.75, ge=0.0, le=1.0)
    random_seed: int | None = None
    reference_api_price: Pricing | None = None
    db_bootstrap_enabled: bool = True
    db_bootstrap_max_rows: int = Field(default=50_000, ge=0)

    output_default_tokens: float = Field(default=512.0, ge=0)
    output_min_bucket_samples: int = Field(default=3, ge=1)
    output_min_model_samples: int = Field(default=3, ge=1)
    output_min_global_samples: int = Field(default=3, ge=1)

    envelope_window_hours: float = Field(default=24.0, gt=0)
    envelope_lower_percentile: float = Field(default=10.0, ge=0, le=100)
    envelope_upper_percentile: float = Field(default=90.0, ge=0, le=100)
    envelope_min_samples: int = Field(default=1, ge=1)
    envelope_bootstrap_donor_models: tuple[str, ...] | None = None

    latency_slo_sec: float = Field(default=3.0, gt=0)
    latency_window_sec: float = Field(default=900.0, gt=0)
    latency_history_prior_window_sec: float = Field(default=86_400.0, gt=0)
    latency_max_samples_per_profile: int = Field(default=5000, ge=1)
    latency_min_samples: int = Field(default=10, ge=1)
    latency_unprofiled_ttft_ms: float = Field(default=5000.0, gt=0)
    latency_hedge_mode: Literal["disabled", "probability_target"] = "disabled"
    latency_fast_half_life_sec: float = Field(default=2.0, ge=0)
    latency_fast_prior_samples: float = Field(default=3.0, ge=0)
    latency_failure_idle_sec: float = Field(default=60.0, ge=0)

    fallback_mode: Literal["policy", "strict"] = "policy"
    explore_unprofiled_share: float = Field(default=0.05, ge=0.0, le=1.0)

    routewise_probe_enabled: bool = False
    routewise_probe_interval_sec: float = Field(default=300.0, gt=0)
    routewise_probe_timeout_sec: float = Field(default=30.0, gt=0)
    routewise_probe_idle_only: bool = True
    routewise_probe_idle_threshold_sec: float = Field(default=900.0, gt=0)
    routewise_probe_max_concurrency: int = Field(default=1, ge=1)

    prefix_cache_cost_adjustment_enabled: bool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_resource_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key in RESOURCE_KEYS:
                    raise ValueError(
                        f"{key!r} is no longer a router_params key: "
                        f"set {RESOURCE_KEYS[key]} instead"
                    )
        return data

    @model_validator(mode="after")
    def _percentiles_ordered(self) -> RouteWiseParams:
        if self.envelope_lower_percentile > self.envelope_upper_percentile:
            raise ValueError("envelope_lower_percentile must not exceed envelope_upper_percentile")
        return self
