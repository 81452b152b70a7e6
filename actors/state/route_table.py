"""A model's route table: declared routes, effective weights, and the circuit view.

Effective weight = the admin override if any, else the configured weight; then, for the
``fixed`` router with a ``local_fraction`` (router_params, else ``routing.local_fraction``),
the weight manager's split: local routes share that fraction of the total and remote routes
the rest; a local route the health-check loop found down gets weight 0, and so does a
``fallback_only`` route (never drawn; ModelActor puts it after the drawn ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.state.circuit import CLOSED
from actors.strategies import RouteView
from schemas import (
    EndpointState,
    InvalidRequestError,
    ModelStatus,
    RouteCandidate,
    RouteNotFoundError,
    RouteStatus,
)
from schemas.capacity import pool_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from schemas.config import ModelConfig, RouteConfig, RoutingConfig

# An operator's weight is relative to its siblings; past this it only risks an infinite sum.
MAX_WEIGHT = 1e6


def candidate_for(endpoint: str, config: RouteConfig, *, probe: bool = False) -> RouteCandidate:
    """The plan entry for a route, with its first declared credential."""
    creds = config.credential_ids
    return RouteCandidate(
        endpoint=endpoint,
        kind=config.kind,
        base_url=config.base_url,
        upstream_model=config.provider_model_id,
        credential_id=creds[0] if creds else "",
        context_window=config.context_window,
        probe=probe,
        pool=pool_of(config, endpoint) or "",
    )


class RouteEntry:
    """One route: config, endpoint id, effective weight and last known circuit state."""

    __slots__ = (
        "_view",
        "candidate",
        "config",
        "endpoint",
        "index",
        "is_local",
        "local_healthy",
        "modalities",
        "override",
        "probe_candidate",
        "state",
        "weight",
    )

    def __init__(self, index: int, endpoint: str, config: RouteConfig) -> None:
        self.index = index
        self.endpoint = endpoint
        self.config = config
        self.weight = config.weight
        self.override: float | None = None
        self.state: EndpointState | None = None
        self.modalities = frozenset(config.input_modalities)
        self.is_local = config.location().startswith("local-")
        self.local_healthy = True
        self.candidate = candidate_for(endpoint, config)
        self.probe_candidate = candidate_for(endpoint, config, probe=True)
        self._view: RouteView | None = None

    @property
    def circuit(self) -> str:
        """closed, open or half_open, as last reported by the endpoint's owner."""
        return self.state.circuit_state if self.state else CLOSED

    def benched(self, now: float) -> bool:
        """Whether the model bench holds this route out at ``now``."""
        until = self.state.benched_until if self.state else None
        return until is not None and now < until

    def available_at(self, now: float) -> float | None:
        """When this route may take traffic again, if it is known to be out now."""
        st = self.state
        if st is None:
            return None
        times = [t for t in (st.open_until, st.benched_until) if t is not None and t > now]
        return max(times) if times else None

    @property
    def base_weight(self) -> float:
        """The configured weight, or the admin override."""
        return self.config.weight if self.override is None else self.override

    def fits(self, prompt_tokens: int) -> bool:
        """Whether a prompt of ``prompt_tokens`` fits this route's context window."""
        window = self.config.context_window
        return window is None or prompt_tokens <= window

    def view(self, backlog: int) -> RouteView:
        """What a strategy sees of this route: the last view while its weight and
        ``backlog`` are the same (a decision reads every route once or twice)."""
        v = self._view
        if v is None or v.backlog != backlog or v.weight != self.weight:
            v = self._view = RouteView(self.index, self.endpoint, self.weight, self.config, backlog)
        return v


class RouteTable:
    """Owns one model's routes and their effective weights."""

    def __init__(self, model: ModelConfig, routing: RoutingConfig, *, fixed: bool) -> None:
        self.model = model
        self.routes = [
            RouteEntry(i, e, r)
            for i, (e, r) in enumerate(zip(model.endpoint_ids(), model.route, strict=True))
        ]
        self._by_endpoint = {r.endpoint: r for r in self.routes}
        fraction = model.router_params.get("local_fraction", routing.local_fraction)
        self._local_fraction: float | None = fraction if fixed else None
        self._recompute()

    def published(self) -> list[RouteEntry]:
        """Routes of a published model (empty when unpublished)."""
        return self.routes if self.model.published else []

    def get(self, endpoint: str) -> RouteEntry | None:
        """The route ``endpoint``, if this model has it."""
        return self._by_endpoint.get(endpoint)

    def benched(self, now: float) -> Callable[[str], bool]:
        """Whether an endpoint of this model is benched at ``now``."""
        return lambda e: (r := self._by_endpoint.get(e)) is not None and r.benched(now)

    def update_state(self, st: EndpointState) -> None:
        """Fold a newer endpoint state into the view (older ones are ignored)."""
        r = self._by_endpoint.get(st.endpoint)
        if r is not None and (r.state is None or st.seq >= r.state.seq):
            r.state = st

    def set_weight(self, endpoint: str, weight: float | None) -> None:
        """Override (or with None restore) a route's weight.

        Raises RouteNotFoundError for an unknown endpoint; InvalidRequestError for a weight
        outside 0 to MAX_WEIGHT (or NaN) or one that would leave no route with a non-zero
        weight.
        """
        r = self._by_endpoint.get(endpoint)
        if r is None:
            raise RouteNotFoundError(f"model {self.model.id!r} has no route {endpoint!r}")
        if weight is not None and not 0 <= weight <= MAX_WEIGHT:  # NaN too
            raise InvalidRequestError(f"weight must be from 0 to {MAX_WEIGHT:g}", param="weight")
        restored = r.config.weight if weight is None else weight
        after = [restored if x is r else x.base_weight for x in self.routes]
        if not any(w > 0 for w in after):
            raise InvalidRequestError(
                f"refusing to zero the last route of model {self.model.id!r} with a non-zero "
                "weight",
                param="weight",
            )
        r.override = weight
        self._recompute()

    def overrides(self) -> dict[str, float]:
        """Admin overrides by endpoint, for the snapshot."""
        return {r.endpoint: r.override for r in self.routes if r.override is not None}

    def restore_overrides(self, overrides: dict[str, float]) -> None:
        """Re-apply overrides from a snapshot (unknown endpoints are ignored)."""
        for endpoint, weight in overrides.items():
            r = self._by_endpoint.get(endpoint)
            if r is not None and weight >= 0:
                r.override = weight
        self._recompute()

    def set_local_health(self, endpoint: str, healthy: bool) -> None:
        """The health-check loop's verdict on a local deployment."""
        r = self._by_endpoint.get(endpoint)
        if r is not None and r.is_local and r.local_healthy != healthy:
            r.local_healthy = healthy
            self._recompute()

    def _recompute(self) -> None:
        for r in self.routes:
            # A backup is never drawn: its effective weight is 0 whatever it is configured.
            r.weight = 0.0 if r.config.fallback_only else r.base_weight
        f = self._local_fraction
        if f is None:
            return
        drawn = [r for r in self.routes if r.base_weight > 0 and not r.config.fallback_only]
        local = [r for r in drawn if r.is_local]
        remote = [r for r in drawn if not r.is_local]
        if not local or not remote:
            return
        healthy_local = [r for r in local if r.local_healthy]
        total = sum(r.base_weight for r in (*local, *remote))
        local_share = f * total if healthy_local else 0.0
        for group, share in ((healthy_local, local_share), (remote, total - local_share)):
            group_total = sum(r.base_weight for r in group)
            for r in group:
                r.weight = share * r.base_weight / group_total
        for r in local:
            if not r.local_healthy:
                r.weight = 0.0

    def status(self, router: str) -> ModelStatus:
        """Routes with effective weights and the circuits this table sees."""
        return ModelStatus(
            model=self.model.id,
            router=router,
            routes=tuple(
                RouteStatus(
                    endpoint=r.endpoint,
                    kind=r.config.kind,
                    weight=round(r.weight, 6),
                    configured_weight=r.config.weight,
                    circuit_state=r.circuit,
                    fallback_only=r.config.fallback_only,
                    overridden=r.override is not None,
                )
                for r in self.routes
            ),
        )


# A half-open endpoint whose probe is out has no open_until: ask again shortly.
_UNKNOWN_RECOVERY_SECONDS = 1.0


def earliest_recovery(
    routes: list[RouteEntry],
    now: float,
    refused: tuple[RouteCandidate, ...] = (),
    cooling: dict[str, float] | None = None,
) -> float:
    """Seconds until the first of ``routes`` may serve again: when its circuit or bench lets
    it (and its cooling ends), and for a route whose keys all refuse the caller, not before
    one is back."""
    key_waits = {c.endpoint: c.retry_after for c in refused}
    cooling = cooling or {}
    waits = []
    for r in routes:
        at = r.available_at(now)
        if r.endpoint in cooling:
            at = max(at or 0.0, cooling[r.endpoint])
        wait = at - now if at is not None else None
        if r.endpoint in key_waits:
            key_wait = key_waits[r.endpoint]  # None: no key of this caller's comes back
            wait = None if key_wait is None else max(wait or 0.0, key_wait)
        if wait is not None:
            waits.append(wait)
    return min(waits) if waits else _UNKNOWN_RECOVERY_SECONDS
