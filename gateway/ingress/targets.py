"""Credential resolution: a plan's candidate becomes an ``UpstreamTarget``, its secret from the
config or, for keys added at runtime, from a ``SecretSource``. After a reload,
``FallbackTargets`` still resolves what requests planned before it name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gateway.adapters.base import UpstreamTarget
from schemas.config import GatewayConfig, RouteConfig

if TYPE_CHECKING:
    from schemas import RouteCandidate
    from schemas.pricing import Pricing

_DEFAULT_ROUTE = RouteConfig(kind="echo")
_RESOLVED_MAX = 4096


class SecretSource(Protocol):
    """Where secrets of credentials the config does not hold come from (database keys:
    ``gateway.auth.provider_secrets.ProviderSecrets``, which the app passes in)."""

    def get(self, cid: str) -> str | None:
        """The secret of credential ``cid``; None when this source has none."""
        ...


class _NoSecrets:
    def get(self, cid: str) -> str | None:
        return None


NO_SECRETS: SecretSource = _NoSecrets()


class Targets:
    """Resolves a plan's candidate into an UpstreamTarget, secret included: from the config,
    else from ``runtime`` (the secrets of keys added at runtime)."""

    def __init__(self, config: GatewayConfig, runtime: SecretSource = NO_SECRETS) -> None:
        self._runtime = runtime
        self._routes: dict[str, RouteConfig] = {}
        self.prices: dict[str, Pricing | None] = {}
        """Each endpoint's route's ``pricing:`` (None: unpriced; absent: unknown)."""
        self._secrets: dict[str, str] = {}
        # Made once per (route, secret): a frozen dataclass costs microseconds to build.
        self._resolved: dict[tuple[str, str, str, str, str | None], UpstreamTarget] = {}
        for model in config.models:
            for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
                self._routes[eid] = route
                self.prices[eid] = route.pricing
                for cid, secret in zip(route.credential_ids, route.secrets, strict=True):
                    self._secrets[cid] = secret

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        """The target for candidate ``c`` (unknown endpoints get default timeouts); the same
        object for the same route and secret (a target is immutable)."""
        api_key = (
            self._secrets.get(c.credential_id) or self._runtime.get(c.credential_id)
            if c.credential_id
            else None
        )
        key = (c.endpoint, c.kind, c.base_url, c.upstream_model, api_key)
        target = self._resolved.get(key)
        if target is None:
            target = self._target(c, api_key)
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[key] = target
        return target

    def _target(self, c: RouteCandidate, api_key: str | None) -> UpstreamTarget:
        route = self._routes.get(c.endpoint, _DEFAULT_ROUTE)
        return UpstreamTarget(
            endpoint=c.endpoint,
            kind=c.kind,
            base_url=c.base_url,
            upstream_model=c.upstream_model,
            api_key=api_key,
            timeout=route.timeout_seconds,
            connect_timeout=route.connect_timeout_seconds,
            ttft_timeout=route.ttft_timeout_seconds,
            idle_timeout=route.idle_timeout_seconds,
            azure=route.azure,
            bedrock=route.bedrock,
        )


class FallbackTargets(Targets):
    """Targets of the new config that still resolve, from the previous one, the endpoints
    and credentials a reload removed (for requests planned before the swap)."""

    def __init__(
        self, config: GatewayConfig, previous: Targets, runtime: SecretSource = NO_SECRETS
    ) -> None:
        super().__init__(config, runtime)
        self._known = {e for m in config.models for e in m.endpoint_ids()}
        self._previous = previous
        # A route's pricing from the new config, unless a reload removed the endpoint.
        self.prices = {**previous.prices, **self.prices}

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        """The target for ``c``: from the new config, unless it lost the endpoint or key."""
        if c.endpoint not in self._known:
            return self._previous.resolve(c)
        target = super().resolve(c)
        if c.credential_id and target.api_key is None:
            return self._previous.resolve(c)
        return target
