"""Operator-facing events (``llmgw.events.<kind>``) and supervisor events."""

from __future__ import annotations

import msgspec


class CircuitTransition(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An endpoint's circuit moved from ``old`` to ``new`` (closed, open, half_open)."""

    endpoint: str
    model: str
    old: str
    new: str
    reason: str = ""
    ts: float = 0.0


class AuthRejected(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An upstream refused our credential (401/407): loud from the first one."""

    endpoint: str
    model: str
    status: int
    consecutive: int
    credential_id: str = ""
    ts: float = 0.0


class RouteCapacity(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A route's learned concurrency limit changed (``llmgw.events.capacity``): cut by a
    429 (``rate_limited``) or by its time to first token inflating over its unloaded
    baseline (``ttft_inflated``), or grown by successes (``grew``, at most once a second).
    ``cap`` is its configured ``concurrency:`` limit, if any."""

    model: str
    endpoint: str
    limit: float
    in_flight: int
    reason: str
    cap: int | None = None
    ttft_baseline_ms: float | None = None
    ttft_recent_ms: float | None = None
    ts: float = 0.0


class ChildStarted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A supervisor started a child."""

    supervisor: str
    child: str


class ChildFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A supervised child crashed; ``error`` is the exception's type and message."""

    supervisor: str
    child: str
    error: str


class ChildRestarted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A supervisor restarted a crashed child."""

    supervisor: str
    child: str
    restarts: int


class SupervisorGaveUp(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A supervisor exceeded its restart intensity and stopped its children."""

    supervisor: str
    restarts: int
    period: float


class BenchChanged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A route (upstream model at one endpoint) was benched or lifted."""

    endpoint: str
    model: str
    benched: bool
    until: float | None = None
    reason: str = ""
    ts: float = 0.0


class ModeChanged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The deployment entered or left degraded mode; ``ratio`` is the healthy-endpoint share."""

    mode: str
    since: float
    ratio: float
    ts: float = 0.0


class ModelBreakerTripped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A public model failed ``failures`` consecutive attempts: it is not tried until
    ``until`` (the optional per-model breaker, ``routing.bench.model_breaker_failures``)."""

    model: str
    failures: int
    until: float
    ts: float = 0.0
