"""The YAML configuration, as pydantic models (every model forbids unknown keys).

Endpoint ids are derived here, once, so the ingress and the actors agree on them:
``{model_id}:local-{port}`` for a base URL on a local host, ``{model_id}:{name}`` from the
hostname otherwise (``api.minimax.io`` -> ``minimax-api``), ``{model_id}:{kind}`` for a route
without a base URL (``echo``). A second route of one model at the same place gets ``-2``, ...
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from datetime import date
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from schemas.bedrock_settings import BedrockSettings
from schemas.catalog import AllowanceConfig, CatalogConfig, ChainConfig, SteeringConfig
from schemas.limits import LimitsConfig
from schemas.pricing import Pricing
from schemas.process_config import (
    BusConfig,
    ClusterConfig,
    DashboardConfig,
    DatabaseConfig,
    EventsConfig,
    LogConfig,
    MetricsConfig,
    ServerConfig,
    Strict,
    TelemetryConfig,
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

UPSTREAM_KINDS = ("openai_compat", "anthropic", "echo", "azure_openai", "gemini", "bedrock")
_LOCAL_HOSTS = frozenset({"localhost", "host.docker.internal"})


def credential_id(secret: str) -> str:
    """A short stable id for a credential; the only form of it that logs and events carry."""
    return "k-" + hashlib.sha256(secret.encode()).hexdigest()[:12]


Role = Literal["free", "pro", "internal", "admin"]
"""A caller's tier, lowest first (``schemas.keys.ROLES`` ranks them)."""


class ApiKeyConfig(Strict):
    """An upstream key with a reservation: only callers of ``min_role`` and above spend it."""

    key: str = Field(min_length=1)
    min_role: Role = "free"
    free_allowance: AllowanceConfig | None = None  # for credential_choice least_remaining_quota

    def __repr__(self) -> str:  # the secret never reaches a log line
        return f"ApiKeyConfig(key={credential_id(self.key)!r}, min_role={self.min_role!r})"

    __str__ = __repr__


class QuotaLimit(Strict):
    """A quota route's allowance per window, in its quota source's unit."""

    limit: float = Field(gt=0)


class ConcurrencyLimit(Strict):
    """How many requests a concurrency route (or its pool) may have in flight at once."""

    limit: int = Field(ge=1)


class LocalQuotaSource(Strict):
    """A counter the route's capacity owner keeps itself: exact across ingresses, persisted.

    ``window``: ``hourly`` / ``daily`` / ``monthly`` reset on the calendar in ``timezone``; a
    number of seconds is a rolling window.
    """

    kind: Literal["local"]
    unit: Literal["requests", "tokens"] = "requests"
    window: Literal["hourly", "daily", "monthly"] | Annotated[float, Field(gt=0)] = "daily"
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value


class HttpJsonQuotaSource(Strict):
    """A usage URL polled with the route's credential; ``used_path`` / ``limit_path`` are
    dotted paths into its JSON answer (``data.used``; a list index is a number: ``items.0``)."""

    kind: Literal["http_json"]
    url: str
    used_path: str = Field(min_length=1)
    limit_path: str | None = None
    unit: Literal["requests", "tokens"] = "requests"
    refresh_seconds: float = Field(default=60.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("quota_source.url must be an http:// or https:// URL")
        return value


QuotaSource = Annotated[LocalQuotaSource | HttpJsonQuotaSource, Field(discriminator="kind")]


class AzureSettings(Strict):
    """An ``azure_openai`` route's settings; ``base_url`` is the resource endpoint
    (``https://<resource>.openai.azure.com``).

    ``deployment`` names the deployment in the URL (empty: the route's ``provider_model_id``).
    The key (``api_key``/``api_keys``) goes in the ``api-key`` header; with
    ``entra_token_command`` the route authenticates with a Microsoft Entra ID bearer token
    instead: the command's standard output, run without a shell and reused for
    ``entra_token_ttl_seconds``.
    """

    deployment: str = ""
    api_version: str = Field(default="2024-10-21", min_length=1)
    entra_token_command: tuple[str, ...] | None = Field(default=None, min_length=1)
    entra_token_ttl_seconds: float = Field(default=300.0, gt=0)

    @field_validator("api_version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> object:
        # YAML reads an unquoted 2024-10-21 as a date; the API version is that date's text.
        return value.isoformat() if isinstance(value, date) else value


class RouteConfig(Strict):
    """One way to serve a model: an upstream kind, where it lives, its weight and credential."""

    kind: Literal["openai_compat", "anthropic", "echo", "azure_openai", "gemini", "bedrock"]
    weight: float = Field(default=1.0, ge=0)
    # A backup: never drawn as primary (its weight is not used); tried after the drawn
    # routes, in declaration order, and first when none of them is available.
    fallback_only: bool = False
    base_url: str = ""
    provider_model_id: str = ""
    api_key: str | None = Field(default=None, repr=False)  # secrets stay out of reprs
    api_keys: tuple[str | ApiKeyConfig, ...] = Field(default=(), repr=False)
    input_modalities: tuple[str, ...] = ("text",)
    context_window: int | None = Field(default=None, gt=0)
    timeout_seconds: float = Field(default=600.0, gt=0)
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    ttft_timeout_seconds: float = Field(default=120.0, gt=0)
    idle_timeout_seconds: float = Field(default=60.0, gt=0)
    # Resource semantics (spec "RouteWise"): what the route costs and what bounds it.
    provider_type: Literal["on_demand", "quota", "concurrency"] = "on_demand"
    pricing: Pricing | None = None
    quota: QuotaLimit | None = None
    quota_source: QuotaSource | None = None
    concurrency: ConcurrencyLimit | None = None
    quota_pool: str | None = Field(default=None, min_length=1)
    concurrency_pool: str | None = Field(default=None, min_length=1)
    azure: AzureSettings | None = None  # kind azure_openai: deployment, api version, token
    bedrock: BedrockSettings | None = None  # kind bedrock: region and credential profile

    @model_validator(mode="after")
    def _azure_settings_on_azure_routes(self) -> RouteConfig:
        if self.azure is not None and self.kind != "azure_openai":
            raise ValueError("azure: belongs to a kind: azure_openai route")
        return self

    @model_validator(mode="before")
    @classmethod
    def _bedrock_endpoint(cls, data: Any) -> Any:
        # A bedrock route without a base_url talks to its region's public endpoint.
        if isinstance(data, dict) and data.get("kind") == "bedrock" and not data.get("base_url"):
            settings = data.get("bedrock")
            if isinstance(settings, dict) and isinstance(settings.get("region"), str):
                region = settings["region"]
                return {**data, "base_url": f"https://bedrock-runtime.{region}.amazonaws.com"}
        return data

    @model_validator(mode="after")
    def _bedrock_settings(self) -> RouteConfig:
        if (self.kind == "bedrock") != (self.bedrock is not None):
            raise ValueError("bedrock: {region} is required by, and only for, kind: bedrock")
        if self.kind == "bedrock":
            for secret in self.secrets:
                if len(secret.split(":")) not in (2, 3) or not all(secret.split(":")[:2]):
                    raise ValueError(
                        "a bedrock route's keys are ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]"
                    )
        return self

    @model_validator(mode="after")
    def _resources_match_type(self) -> RouteConfig:
        kind = self.provider_type
        if kind == "quota":
            if self.quota_source is None:
                raise ValueError("a provider_type: quota route needs a quota_source:")
            if self.quota is None and getattr(self.quota_source, "limit_path", None) is None:
                raise ValueError(
                    "a provider_type: quota route needs quota: {limit} (or a "
                    "quota_source with a limit_path)"
                )
        elif self.quota is not None or self.quota_source is not None or self.quota_pool:
            raise ValueError(
                "quota:, quota_source: and quota_pool: belong to a provider_type: quota route"
            )
        if kind == "concurrency":
            if self.concurrency is None:
                raise ValueError("a provider_type: concurrency route needs concurrency: {limit}")
        elif self.concurrency is not None or self.concurrency_pool:
            raise ValueError(
                "concurrency: and concurrency_pool: belong to a provider_type: concurrency route"
            )
        return self

    @model_validator(mode="after")
    def _needs_base_url(self) -> RouteConfig:
        if self.kind != "echo" and not self.base_url:
            raise ValueError(f"a route of kind {self.kind!r} needs a base_url")
        if self.base_url and urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError("base_url must be an http:// or https:// URL")
        return self

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every credential of this route, in declared order."""
        return tuple(secret for secret, _ in self.key_declarations)

    @property
    def key_declarations(self) -> tuple[tuple[str, str], ...]:
        """(secret, min_role) of every credential, in declared order; a key declared twice
        keeps its most restrictive ``min_role`` (``free`` is the absence of a declaration)."""
        out: dict[str, str] = {}
        entries = [self.api_key] if self.api_key else []
        for entry in (*entries, *self.api_keys):
            secret, role = (
                (entry, "free") if isinstance(entry, str) else (entry.key, entry.min_role)
            )
            old = out.get(secret, "free")
            out[secret] = role if _ROLE_ORDER.index(role) > _ROLE_ORDER.index(old) else old
        return tuple(out.items())

    @property
    def allowances(self) -> dict[str, AllowanceConfig]:
        """The free allowance each credential declares, by credential id."""
        return {
            credential_id(k.key): k.free_allowance
            for k in self.api_keys
            if isinstance(k, ApiKeyConfig) and k.free_allowance is not None
        }

    @property
    def credential_ids(self) -> tuple[str, ...]:
        """The ids of :attr:`secrets`, in the same order."""
        return tuple(credential_id(s) for s in self.secrets)

    def location(self) -> str:
        """The part of the endpoint id that names where this route lives."""
        if not self.base_url:
            return self.kind
        parts = urlsplit(self.base_url)
        host = (parts.hostname or "").lower()
        if _is_local(host):
            port = parts.port or (443 if parts.scheme == "https" else 80)
            return f"local-{port}"
        if self.kind not in ("openai_compat",):
            return f"{self.kind}-api"
        labels = host.split(".")
        if len(labels) > 1:
            labels = labels[:-1]  # the TLD says nothing about the provider
        return "-".join(reversed(labels))


def _is_local(host: str) -> bool:
    if host in _LOCAL_HOSTS or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local


_ROLE_ORDER = ("free", "pro", "internal", "admin")


class ModelConfig(Strict):
    """A public model id and the routes that serve it (spec: the model-registry entry)."""

    id: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
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
    path: str = "/health"
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
    under ``min_limit``; ``enabled: false`` counts and learns but never spills."""

    enabled: bool = True
    min_limit: float = Field(default=2.0, ge=1)
    ttft_inflation: float = Field(default=2.0, gt=1)


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
    admin_key: str | None = Field(default=None, repr=False)
    models: tuple[ModelConfig, ...] = ()
    chains: tuple[ChainConfig, ...] = ()
    steering: SteeringConfig = SteeringConfig()
    dashboard: DashboardConfig = DashboardConfig()
    limits: LimitsConfig = LimitsConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

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

    def model(self, name: str) -> ModelConfig | None:
        """The model whose id or alias is ``name``."""
        for m in self.models:
            if m.id == name or name in m.aliases:
                return m
        return None
