"""The strategy seam: what a routing strategy sees and must answer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

from schemas.config import PrefillConfig, RouteConfig

if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Mapping, Sequence

    from actors.base import ActorContext
    from schemas import (
        CapacityState,
        Observation,
        RouteCandidate,
        RouteRequest,
        RouteWiseCandidate,
    )
    from schemas.config import ModelConfig


class StrategyParams(BaseModel):
    """Base of every strategy's ``router_params`` model: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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


@dataclass(frozen=True, slots=True)
class ProbeTick:
    """Local timer message a StrategyHost arms on its actor: run a probe round."""


class StrategyHost(Protocol):
    """What the hosting ModelActor does for a strategy besides asking it to choose (a
    strategy that needs nothing more has no host): its start, the view events it feeds it,
    the timer's probe rounds and the candidate rows of status and explain."""

    async def start(self, ctx: ActorContext) -> None: ...

    def feed(self, msg: object) -> bool:
        """Apply a view event meant for the strategy; False for any other message."""
        ...

    async def probe_round(self, ctx: ActorContext, live: Mapping[str, RouteCandidate]) -> None:
        """On a :class:`ProbeTick`: one round of probes over ``live`` (closed, not benched
        routes), then re-arm the timer."""
        ...

    def rows(self, views: Sequence[RouteView], req: RouteRequest) -> tuple[RouteWiseCandidate, ...]:
        """Each route's priced row for ``req`` (status and explain)."""
        ...

    @property
    def prompt_tokens(self) -> int:
        """The prompt size status prices its rows for (the last request's)."""
        ...


class RoutingStrategy(Protocol):
    """Picks the primary route among admissible ones; may learn from observations.

    ``select`` gets at least one route, all with weight > 0 and admitted by their circuits,
    in declaration order. It returns one of them.

    The other members are optional hooks with defaults; a strategy subclasses this class to
    inherit them and overrides the ones it needs, so its host never asks which strategy it
    holds.
    """

    session_affinity: bool = True
    """Whether a caller's session pin may choose for it (False: the strategy must see every
    request, as round_robin and RouteWise do)."""

    orders_fallbacks: bool = False
    """Whether :meth:`fallback_order` has an order of its own (else: declaration order)."""

    reads_backlog: bool = True
    """Whether it reads a view's ``backlog`` (False: its views carry 0, which spares the
    host a look-up per route and decision)."""

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView: ...

    def observe(self, observation: Observation) -> None: ...

    @property
    def single_route(self) -> bool:
        """Whether the plan holds the primary only (no fallbacks)."""
        return False

    def fallback_order(
        self, routes: Sequence[RouteView], request: RouteRequest, *, after_select: bool = False
    ) -> list[RouteView]:
        """The plan's drawn routes after the primary, in the strategy's order (asked only
        when :attr:`orders_fallbacks`). ``after_select``: ``routes`` are the views the last
        :meth:`select` for ``request`` chose from, without its choice, in their order."""
        return list(routes)

    def hedge_after_ms(self, primary: str, backup: str) -> float | None:
        """After how many ms a hedge to ``backup`` should start beside ``primary``; None:
        no hedge."""
        return None

    def host(self, model: ModelConfig, clock: Callable[[], float]) -> StrategyHost | None:
        """The hosting actor's extra duties for this strategy, or None when it has none."""
        return None
