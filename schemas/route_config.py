"""One route of a model in the YAML configuration: its upstream kind, where it lives, its
credentials and their reservations, and what bounds it (quota, concurrency, pools), as
pydantic models that forbid unknown keys; ``schemas.config`` gathers them into ``ModelConfig``.

Where a route lives names its endpoint (``RouteConfig.location``): ``local-{port}`` for a base
URL on a local host, a name from the hostname otherwise (``api.minimax.io`` ->
``minimax-api``), the kind for a route without a base URL (``echo``).
"""

from __future__ import annotations

import hashlib
import ipaddress
from datetime import date
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from schemas.bedrock_settings import BedrockSettings
from schemas.catalog import AllowanceConfig
from schemas.pricing import Pricing
from schemas.process_config import FilledPrintable, Printable, Strict

UPSTREAM_KINDS = ("openai_compat", "anthropic", "echo", "azure_openai", "gemini", "bedrock")
_LOCAL_HOSTS = frozenset({"localhost", "host.docker.internal"})
# Anthropic requires max_tokens; chat does not. 4096 fits every current Claude model's
# output limit while leaving room for long answers.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
# The budget_tokens a chat reasoning_effort thinks with on an anthropic route (1024,
# Anthropic's least, for minimal too); a request without max_tokens is sent the default
# plus its budget.
ANTHROPIC_THINKING_BUDGETS = {
    "minimal": 1024,
    "low": 1024,
    "medium": 2048,
    "high": 4096,
    "xhigh": 8192,
    "max": 16384,
}


def credential_id(secret: str) -> str:
    """A short stable id for a credential; the only form of it that logs and events carry."""
    return "k-" + hashlib.sha256(secret.encode()).hexdigest()[:12]


Role = Literal["free", "pro", "internal", "admin"]
"""A caller's tier, lowest first (``schemas.keys.ROLES`` ranks them)."""


class ApiKeyConfig(Strict):
    """An upstream key with a reservation: only callers of ``min_role`` and above spend it."""

    key: FilledPrintable
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
    # Secrets stay out of reprs; an empty key is refused, never read as "no credential".
    api_key: FilledPrintable | None = Field(default=None, repr=False)
    api_keys: tuple[Printable | ApiKeyConfig, ...] = Field(default=(), repr=False)
    input_modalities: tuple[Literal["text", "image", "audio", "file"], ...] = ("text",)
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
    bedrock: BedrockSettings | None = None  # kind bedrock: region, credentials, model family

    @property
    def default_max_tokens(self) -> int | None:
        """The ``max_tokens`` this route is sent for a request that sets none (Claude's
        Messages API requires one), which its provider reserves of its token limit while the
        answer runs; None: the request goes without."""
        return ANTHROPIC_DEFAULT_MAX_TOKENS if self.kind == "anthropic" else None

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
        if self.bedrock is not None and (
            problem := self.bedrock.contradiction(self.provider_model_id)
        ):
            raise ValueError(problem)
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

    @field_validator("api_keys")
    @classmethod
    def _no_empty_key(cls, value: tuple[str | ApiKeyConfig, ...]) -> tuple[str | ApiKeyConfig, ...]:
        if any(entry == "" for entry in value):
            raise ValueError("a key must not be empty")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url_shape(cls, value: str) -> str:
        # Checked here, not where the endpoint id is made from it, so a refusal names the
        # field's path; never quoting the value (it may carry a credential).
        if not value:
            return value  # needed or not by kind: _needs_base_url
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("names no host (expected http[s]://HOST[:PORT][/PATH])")
        if "@" in parts.netloc:
            # No adapter sends a URL's user:password (it was dropped: the upstream answered
            # 401), and the base URL is shown to admins (/routing, /health/deep).
            raise ValueError("must not carry credentials (user:password@): use api_key")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:  # an explicit :0, or out of range, or not a number
            raise ValueError("has an invalid port (expected 1-65535)")
        if "?" in value or "#" in value:
            # Every adapter appends its API's path to base_url, which would land in the query
            # or fragment; an Azure route's api-version is set as azure: {api_version}.
            raise ValueError("must not have a query (?...) or a fragment (#...)")
        return value

    @model_validator(mode="after")
    def _needs_base_url(self) -> RouteConfig:
        if self.kind != "echo" and not self.base_url:
            raise ValueError(f"a route of kind {self.kind!r} needs a base_url")
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
