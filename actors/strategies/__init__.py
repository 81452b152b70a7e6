"""Routing strategies: a registry of named behaviours a ModelActor hosts.

A strategy module registers itself with :func:`register_strategy`; a model's ``router:``
(or ``routing.default_router``) names one, and its ``router_params:`` are validated by the
strategy's params model (``extra="forbid"``). A strategy whose optional dependency is missing
is registered with :func:`register_missing_strategy` so choosing it fails validation with the
reason instead of breaking import. See docs/strategies.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from actors.strategies.base import (
    ProbeTick,
    RouteView,
    RoutingStrategy,
    StrategyDeps,
    StrategyHost,
    StrategyParams,
)

if TYPE_CHECKING:
    from actors.base import Serve
    from schemas.config import ModelConfig

StrategyFactory = Callable[[Any, StrategyDeps], RoutingStrategy]

_REGISTRY: dict[str, tuple[StrategyFactory, type[StrategyParams]]] = {}
_SERVES: dict[str, Callable[[ModelConfig], tuple[Serve, ...]]] = {}
_MISSING: dict[str, str] = {}


def register_strategy(
    name: str,
    params: type[StrategyParams],
    *,
    serves: Callable[[ModelConfig], tuple[Serve, ...]] | None = None,
) -> Callable[[StrategyFactory], StrategyFactory]:
    """Decorator: register ``factory(params) -> RoutingStrategy`` under ``name``; ``serves``:
    the extra subjects a hosting actor subscribes for it (its StrategyHost's)."""

    def deco(factory: StrategyFactory) -> StrategyFactory:
        _REGISTRY[name] = (factory, params)
        if serves is not None:
            _SERVES[name] = serves
        _MISSING.pop(name, None)
        return factory

    return deco


def strategy_serves(name: str, model: ModelConfig) -> tuple[Serve, ...]:
    """The extra subjects a ModelActor hosting strategy ``name`` for ``model`` serves."""
    serves = _SERVES.get(name)
    return () if serves is None else serves(model)


def register_missing_strategy(name: str, reason: str) -> None:
    """Record that ``name`` exists but cannot be used here, and why."""
    if name not in _REGISTRY:
        _MISSING[name] = reason


def known_strategies() -> tuple[str, ...]:
    """Names that can be chosen, sorted."""
    return tuple(sorted(_REGISTRY))


def validate_strategy(
    name: str, params: dict[str, Any], model: ModelConfig | None = None
) -> StrategyParams:
    """Validate ``params`` for strategy ``name`` and, given the ``model`` they belong to,
    that it can start under it (:func:`startup_problem`). Raises ValueError saying what is
    known (a startup problem: ``StartupProblemError``)."""
    if name in _MISSING:
        raise ValueError(f"router {name!r} is not available: {_MISSING[name]}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown router {name!r}; known routers: {', '.join(known_strategies())}")
    _, params_model = _REGISTRY[name]
    try:
        valid = params_model.model_validate(params)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        where = f"{key}: " if key else ""
        raise ValueError(f"router_params for {name!r}: {where}{msg}") from None
    problem = startup_problem(name, model) if model is not None else None
    if problem is not None:
        raise StartupProblemError(problem)
    return valid


class StartupProblemError(ValueError):
    """A model that cannot start under its (valid) router; the message says what to do."""


def startup_problem(name: str, model: ModelConfig) -> str | None:
    """Why ``model`` cannot start under strategy ``name`` (its params already valid), or
    None: a strategy may define ``startup_problem(model, params)`` on its factory."""
    if name not in _REGISTRY:
        return None
    factory, params_model = _REGISTRY[name]
    check = getattr(factory, "startup_problem", None)
    if check is None:
        return None
    problem: str | None = check(model, params_model.model_validate(model.router_params))
    return problem


def build_strategy(
    name: str, params: dict[str, Any], deps: StrategyDeps | None = None
) -> RoutingStrategy:
    """A fresh strategy instance. Raises ValueError as validate_strategy does."""
    validated = validate_strategy(name, params)
    factory, _ = _REGISTRY[name]
    return factory(validated, deps or StrategyDeps())


from actors.strategies import fixed, greedy, round_robin  # noqa: E402, F401  (registration)

try:  # RouteWise is optional at import time: its absence must not break the gateway.
    import llm_routewise  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the install
    register_missing_strategy("routewise", f"the llm-routewise package is not installed ({_exc})")
else:
    from actors.strategies import routewise  # noqa: F401  (registration)

__all__ = [
    "ProbeTick",
    "RouteView",
    "RoutingStrategy",
    "StartupProblemError",
    "StrategyDeps",
    "StrategyHost",
    "StrategyParams",
    "build_strategy",
    "known_strategies",
    "register_missing_strategy",
    "register_strategy",
    "startup_problem",
    "strategy_serves",
    "validate_strategy",
]
