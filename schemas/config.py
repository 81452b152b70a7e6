"""The YAML configuration, as pydantic models (every model forbids unknown keys): the file's
``GatewayConfig``, its models and the ``routing:`` knobs. A route's own settings are in
``schemas.route_config``, the process's in ``schemas.process_config``; both are re-exported
here, so ``schemas.config`` names every part of the file.

Endpoint ids are derived here, once, so the ingress and the actors agree on them:
``{model_id}:{location}`` per route (``RouteConfig.location``); a second route of one model at
the same place gets ``-2``, ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, model_validator

from schemas.catalog import CatalogConfig, ChainConfig, SteeringConfig
from schemas.limits import LimitsConfig
from schemas.process_config import (
    BusConfig,
    ClusterConfig,
    DashboardConfig,
    DatabaseConfig,
    EventsConfig,
    FilledPrintable,
    LogConfig,
    MetricsConfig,
    Printable,
    ServerConfig,
    Strict,
    TelemetryConfig,
)
from schemas.route_config import (
    UPSTREAM_KINDS,
    ApiKeyConfig,
    AzureSettings,
    ConcurrencyLimit,
    HttpJsonQuotaSource,
    LocalQuotaSource,
    QuotaLimit,
    Role,
    RouteConfig,
    credential_id,
)

__all__ = [
    "UPSTREAM_KINDS",
    "AffinityConfig",
    "ApiKeyConfig",
    "AzureSettings",
    "BenchConfig",
    "BusConfig",
    "CircuitConfig",
    "ClusterConfig",
    "ConcurrencyLimit",
    "DashboardConfig",
    "DatabaseConfig",
    "DegradedConfig",
    "EventsConfig",
    "FailoverConfig",
    "GatewayConfig",
    "HealthCheckConfig",
    "HttpJsonQuotaSource",
    "KeyPoolConfig",
    "LearnedCapacityConfig",
    "LeaseConfig",
    "LocalQuotaSource",
    "LogConfig",
    "MetricsConfig",
    "ModelConfig",
    "PrefillConfig",
    "QuotaLimit",
    "RouteConfig",
    "RoutingConfig",
    "ServerConfig",
    "TelemetryConfig",
    "credential_id",
]


class ModelConfig(Strict):
    """A public model id and the routes that serve it (spec: the model-registry entry)."""

    id: FilledPrintable
    aliases: tuple[FilledPrintable, ...] = ()
    router: str | None = None
    router_params: dict[str, Any] = Field(default_factory=dict)
    route: tuple[RouteConfig, ...] = ()
    published: bool = True
    owned_by: str = "llmgw"
    required_role: Role | None = None
    catalog: CatalogConfig = CatalogConfig()
    credential_choice: Literal["auto", "least_remaining_quota"] = "auto"

    def endpoint_ids(self) -> tuple[str, ...]:
        """Endpoint id of each route, in declared order."""
        seen: dict[str, int] = {}
        out: list[str] = []
        for r in self.route:
            base = f"{self.id}:{r.location()}"
            n = seen.get(base, 0) + 1
            seen[base] = n
            out.append(base if n == 1 else f"{base}-{n}")
        return tuple(out)


class CircuitConfig(Strict):
    """Endpoint health knobs; the spec's environment variables override these."""

    failure_threshold: int = Field(default=3, ge=1)
    cooldown_seconds: float = Field(default=30.0, gt=0)
    min_availability: float = Field(default=0.7, ge=0, le=1)
    ewma_alpha: float = Field(default=0.1, gt=0, le=1)


class AffinityConfig(Strict):
    """Session affinity (spec "Session affinity"); env ROUTING_AFFINITY_ENABLED wins."""

    enabled: bool = True
    ttl_seconds: float = Field(default=300.0, gt=0)
    sweep_threshold: int = Field(default=1000, ge=1)


class PrefillConfig(Strict):
    """Prefill-aware selection (spec); the ROUTING_PREFILL_* environment variables win."""

    enabled: bool = True
    intervene_tokens: int = Field(default=50_000, ge=0)
    elephant_tokens: int = Field(default=200_000, ge=1)
    elephant_limit: int = Field(default=1, ge=1)
    affinity_ceiling: int = Field(default=150_000, ge=0)
    hint_ttl_seconds: float = Field(default=1200.0, gt=0)


class HealthCheckConfig(Strict):
    """The probe loop over local deployments' ``/health``; feeds the local/remote split."""

    enabled: bool = False
    interval_seconds: float = Field(default=10.0, gt=0)
    path: str = Field(default="/health", pattern=r"^/")
    timeout_seconds: float = Field(default=2.0, gt=0)


class KeyPoolConfig(Strict):
    """Upstream key pools (spec "Reserving upstream keys for a tier"): mute and binding times.

    A key-specific failure mutes a key for ``mute_seconds`` (a provider ``Retry-After`` is a
    floor); a caller's only key tolerates ``sole_key_tolerance`` consecutive failures, then
    mutes for ``sole_key_backoff_seconds`` doubling up to ``sole_key_backoff_max_seconds``.
    A spent quota or billing mutes the key at once for ``mute_seconds`` doubling each time it
    is found still spent (by a request or its probe) up to ``quota_mute_max_seconds``, or
    until the reset the provider gave when that is later; a success resets the doubling.
    A provider's rate limit (a 429 that is not a quota exhaustion) does not mute: the key
    cools for the provider's ``Retry-After`` (or ``x-ratelimit-reset-*``), else for
    ``cooling_seconds`` doubling while 429s continue up to ``cooling_max_seconds``.
    """

    mute_seconds: float = Field(default=300.0, gt=0)
    quota_mute_max_seconds: float = Field(default=86400.0, gt=0)
    cooling_seconds: float = Field(default=1.0, gt=0)
    cooling_max_seconds: float = Field(default=60.0, gt=0)
    binding_ttl_seconds: float = Field(default=300.0, gt=0)
    sole_key_tolerance: int = Field(default=2, ge=0)
    sole_key_backoff_seconds: float = Field(default=15.0, gt=0)
    sole_key_backoff_max_seconds: float = Field(default=300.0, gt=0)
    sweep_threshold: int = Field(default=1000, ge=1)


class BenchConfig(Strict):
    """The model bench (spec "A failing model is benched"): ``failures`` retryable failures of
    one route inside ``window_seconds`` bench it for ``duration_seconds`` on every credential;
    background probes re-validate it, first after the circuit cooldown (or after
    ``probe_after_fraction`` of the bench when that is sooner), then with doubling gaps of at
    most ``probe_max_interval_seconds``, so a route back from an outage is probed and back in
    rotation within that."""

    failures: int = Field(default=3, ge=1)
    window_seconds: float = Field(default=900.0, gt=0)
    duration_seconds: float = Field(default=600.0, gt=0)
    probe_after_fraction: float = Field(default=0.5, gt=0, lt=1)
    probe_max_interval_seconds: float = Field(default=60.0, gt=0)
    model_breaker_failures: int = Field(default=0, ge=0)


class LearnedCapacityConfig(Strict):
    """Each route's learned concurrency limit (actors/state/route_load.py): AIMD cut by 429s
    and by a time to first token over ``ttft_inflation`` times its unloaded baseline, never
    under ``min_limit``; ``enabled: false`` counts and learns but never spills.
    ``pace_rate_limits``: a route whose answers report its provider's request rate limit
    (OpenAI's ``x-ratelimit-*-requests``, Anthropic's ``anthropic-ratelimit-requests-*``) is
    at its limit while the requests that limit has left are spent (actors/state/rate_pace.py)."""

    enabled: bool = True
    min_limit: float = Field(default=2.0, ge=1)
    ttft_inflation: float = Field(default=2.0, gt=1)
    pace_rate_limits: bool = True


class DegradedConfig(Strict):
    """Degraded mode: entered when the healthy-endpoint ratio stays under ``threshold`` for
    ``entry_seconds``; left when it stays at or above it for the longer ``exit_seconds``."""

    enabled: bool = True
    threshold: float = Field(default=0.5, ge=0, le=1)
    entry_seconds: float = Field(default=60.0, ge=0)
    exit_seconds: float = Field(default=180.0, ge=0)
    pass_interval_seconds: float = Field(default=10.0, gt=0)


class FailoverConfig(Strict):
    """The shared failover loop: a hop cap and one wall-clock budget per request.

    No retry starts after ``budget_seconds`` (0 disables), and an attempt still waiting for its
    first byte when the budget expires is cancelled if another route could take over; the
    first attempt and the first retry always run. When every route is cooling after its
    provider's 429, a request waits for the earliest reset and tries again if that is at most
    ``cooling_wait_seconds`` away (in all, per request, and within the budget; 0 disables),
    else it is answered 503 with ``Retry-After``.
    """

    max_attempts: int = Field(default=20, ge=1)
    budget_seconds: float = Field(default=45.0, ge=0)
    cooling_wait_seconds: float = Field(default=2.0, ge=0)


class LeaseConfig(Strict):
    """Capacity leases (quota units, concurrency slots): the ingress renews a lease while its
    request runs; one it stops renewing (its ingress died) expires after ``ttl_seconds``.
    A lease renewed but never released (a forgotten release) expires at its maximum age:
    ``max_age_seconds``, else the longest ``timeout_seconds`` of its pool's routes plus one
    TTL."""

    ttl_seconds: float = Field(default=30.0, gt=0)
    max_age_seconds: float | None = Field(default=None, gt=0)

    def max_age(self, timeouts: Iterable[float]) -> float:
        """The maximum age of a lease on a pool whose routes have ``timeouts``."""
        if self.max_age_seconds is not None:
            return self.max_age_seconds
        return max(timeouts, default=0.0) + self.ttl_seconds


class RoutingConfig(Strict):
    """The routing file's section: default strategy, health, affinity and prefill knobs."""

    default_router: str = "fixed"
    circuit: CircuitConfig = CircuitConfig()
    affinity: AffinityConfig = AffinityConfig()
    prefill: PrefillConfig = PrefillConfig()
    health_check: HealthCheckConfig = HealthCheckConfig()
    failover: FailoverConfig = FailoverConfig()
    bench: BenchConfig = BenchConfig()
    degraded: DegradedConfig = DegradedConfig()
    local_fraction: float | None = Field(default=None, ge=0, le=1)
    trust_proxy_headers: bool = False
    decision_timeout_seconds: float = Field(default=5.0, gt=0)
    key_pool: KeyPoolConfig = KeyPoolConfig()
    leases: LeaseConfig = LeaseConfig()
    learned_capacity: LearnedCapacityConfig = LearnedCapacityConfig()


class GatewayConfig(Strict):
    """The whole configuration file."""

    server: ServerConfig = ServerConfig()
    bus: BusConfig = BusConfig()
    cluster: ClusterConfig = ClusterConfig()
    routing: RoutingConfig = RoutingConfig()
    database: DatabaseConfig = DatabaseConfig()
    log: LogConfig = LogConfig()
    events: EventsConfig = EventsConfig()
    metrics: MetricsConfig = MetricsConfig()
    auth: Literal["auto", "required"] = "auto"
    auth_cache_seconds: float = Field(default=5.0, ge=0)
    admin_key: Printable | None = Field(default=None, repr=False)
    models: tuple[ModelConfig, ...] = ()
    chains: tuple[ChainConfig, ...] = ()
    steering: SteeringConfig = SteeringConfig()
    dashboard: DashboardConfig = DashboardConfig()
    limits: LimitsConfig = LimitsConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    def lease_max_age(self) -> float:
        """The longest a capacity lease of any pool may live (its renewals stop then)."""
        return self.routing.leases.max_age(r.timeout_seconds for m in self.models for r in m.route)

    @model_validator(mode="after")
    def _unique_ids(self) -> GatewayConfig:
        seen: set[str] = set()
        for m in self.models:
            for name in (m.id, *m.aliases):
                if name in seen:
                    raise ValueError(f"model id or alias {name!r} is declared twice")
                if name.lower() == "auto" or name.lower().startswith("auto:"):
                    raise ValueError(f"model id or alias {name!r} is taken by steering (auto)")
                seen.add(name)
        return self

    @model_validator(mode="after")
    def _chains_name_models(self) -> GatewayConfig:
        ids = {m.id for m in self.models}
        names: set[str] = set()
        for chain in self.chains:
            if chain.name in names:
                raise ValueError(f"chain {chain.name!r} is declared twice")
            names.add(chain.name)
            named = [e.model for e in chain.entries()]
            if len(set(named)) != len(named):
                raise ValueError(f"chain {chain.name!r} names a model twice")
            for entry in chain.entries():
                if entry.model not in ids:
                    raise ValueError(
                        f"chain {chain.name!r} names {entry.model!r}, which is no model id"
                    )
        active = self.steering.active_chain
        if active is not None and active not in names:
            raise ValueError(f"steering.active_chain {active!r} is no chain of chains:")
        if active is not None and any(c.name == active and c.org for c in self.chains):
            raise ValueError(
                f"steering.active_chain {active!r} belongs to an organisation; "
                "the active chain must be deployment-wide"
            )
        return self

    @model_validator(mode="after")
    def _capacity_pools_agree(self) -> GatewayConfig:
        from schemas.capacity import capacity_pools  # capacity reads this module's types

        capacity_pools(self)  # raises ValueError naming a pool declared two ways
        return self

    def unpriced_endpoints(self) -> tuple[str, ...]:
        """Endpoint ids of the routes with no ``pricing:``: billed $0, so no budget counts
        them (an explicit ``pricing: {prompt: 0, completion: 0}`` is a priced, free route;
        the built-in ``echo`` upstream answers locally, with nothing to bill)."""
        return tuple(
            eid
            for m in self.models
            for eid, route in zip(m.endpoint_ids(), m.route, strict=True)
            if route.pricing is None and route.kind != "echo"
        )

    def model(self, name: str) -> ModelConfig | None:
        """The model whose id or alias is ``name``."""
        for m in self.models:
            if m.id == name or name in m.aliases:
                return m
        return None
