"""The strategy seam: what a routing strategy sees and must answer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

from schemas.config import PrefillConfig, RouteConfig

if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Sequence

    from schemas import CapacityState, Observation, RouteRequest
    from schemas.config import ModelConfig


class StrategyParams(BaseModel):
    """Base of every strategy's ``router_params`` model: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class RouteView:
    """One admissible route as a strategy sees it: declared position, id, effective weight,
    and the un-cached prompt tokens currently in prefill there (``backlog``)."""

    index: int
    endpoint: str
    weight: float
    route: RouteConfig
    backlog: int = 0


@dataclass(frozen=True, slots=True)
class StrategyDeps:
    """What the hosting ModelActor hands every strategy besides its params: the prefill
    knobs, the model it routes (None in bare unit tests), the actor's clock and its capacity
    view: ``capacity(endpoint)`` is the state of that route's pool (None: on-demand, or not
    known yet), read from the ModelActor's ``CapacityViews``; each route's load; and its
    random source."""

    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    model: ModelConfig | None = None
    clock: Callable[[], float] = time.time
    capacity: Callable[[str], CapacityState | None] = field(default=lambda _endpoint: None)
    # ``load(endpoint)``: (requests in flight, learned concurrency limit or None), the
    # ModelActor's count (actors/state/route_load.py).
    load: Callable[[str], tuple[int, float | None]] = field(default=lambda _endpoint: (0, None))
    rng: random.Random | None = None
    """The strategy's random draws (seeded by the replay); None: a fresh unseeded one."""


class RoutingStrategy(Protocol):
    """Picks the primary route among admissible ones; may learn from observations.

    ``select`` gets at least one route, all with weight > 0 and admitted by their circuits,
    in declaration order. It returns one of them.
    """

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView: ...

    def observe(self, observation: Observation) -> None: ...
