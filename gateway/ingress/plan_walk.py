"""PlanWalk: the public models one request may be served by, in order, and their plans.

A plain model id is a walk of one. A steered request (``auto``, ``auto:<axis>``,
``auto:<chain>``) walks its ordered models: the failover loop tries the first model's plan
(its routes, weights, circuits, benches, key pools, affinity — the one bus round trip of the
happy path), then asks the next model for its plan, and so on; the hop cap and the wall-clock
budget count across the whole walk. A model that cannot plan (every circuit open, no route
for the modality or the context, ...) is skipped; when none of them can, the first one's
error is the answer, so the error a client sees is deterministic. A bus failure (no
responder, no reply in time, bus closed) is not skipped: it says the control plane is down,
not that one model cannot plan, and the next model would only wait as long again.

A walk with a ``Budget`` (the live path's; explain's has none) waits rather than answer 503
when all that holds a request out is back-pressure: every route cooling after its provider's
429, the earliest reset within the request's cooling wait. It sleeps until that reset (a
timer on the event loop's clock, no polling) and walks again from the first model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from bus import BusClosedError
from schemas import AllRoutesCoolingError, BusTimeoutError, GatewayError, NoRespondersError

if TYPE_CHECKING:
    from gateway.ingress.failover import Budget
    from gateway.ingress.request_info import RequestInfo
    from gateway.steering.resolver import Resolution
    from schemas import RoutePlan
    from schemas.config import ModelConfig

Ask = Callable[["ModelConfig"], Awaitable["RoutePlan"]]

_CONTROL_PLANE_DOWN = (BusTimeoutError, NoRespondersError, BusClosedError)


class PlanWalk:
    """Owns the position of one request in its ordered models; ``info.model`` follows the
    model whose plan is being tried."""

    __slots__ = ("_ask", "_info", "_models", "_next", "budget", "steered")

    def __init__(
        self,
        models: Sequence[ModelConfig],
        ask: Ask,
        info: RequestInfo,
        steered: Resolution | None = None,
        budget: Budget | None = None,
    ) -> None:
        self._models = models
        self._ask = ask
        self._info = info
        self._next = 0
        self.steered = steered
        self.budget = budget

    @property
    def has_more(self) -> bool:
        """Whether another model may still be asked for a plan."""
        return self._next < len(self._models)

    async def first(self) -> RoutePlan:
        """The first plan any model makes (once a cooling route is back, when that is all
        that holds the request out and the budget lets it wait). Raises the first model's
        GatewayError when none can plan."""
        while True:
            plan, errors = await self._first_of_all()
            if plan is not None:
                return plan
            if not await self._waited(errors):
                raise errors[0]

    async def after_cooling(self) -> RoutePlan | None:
        """Walk again from the first model, every attempt so far having met a 429: the
        first plan, asked at once (routes the attempts did not reach may be free) and then
        each time the earliest cooling route is back, while the budget lets the request
        wait; None when it does not, or no model can plan for another reason."""
        while True:
            self._next = 0
            # Shielded as the loop's own plan requests: a plan arrives with a lease.
            with anyio.CancelScope(shield=True):
                try:
                    plan, errors = await self._first_of_all()
                except GatewayError:
                    return None  # the control plane is down: the attempts' errors stand
            if plan is not None:
                return plan
            if not await self._waited(errors):
                return None

    async def _first_of_all(self) -> tuple[RoutePlan | None, list[GatewayError]]:
        """The first plan a model makes from the walk's position, with the errors of the
        models before it that could not plan. Raises a bus failure."""
        errors: list[GatewayError] = []
        while self.has_more:
            try:
                return await self._take(), errors
            except _CONTROL_PLANE_DOWN:
                raise
            except GatewayError as err:
                errors.append(err)
        return None, errors

    async def _waited(self, errors: list[GatewayError]) -> bool:
        """Sleep until the first route of the models that are cooling is back, and rewind
        the walk, when the budget lets the request wait that long; False when it does not
        (or no model was only cooling)."""
        waits = [e.retry_after for e in errors if isinstance(e, AllRoutesCoolingError)]
        known = [w for w in waits if w is not None]
        wait = self.budget.cooling_wait(min(known)) if known and self.budget else None
        if wait is None:
            return False
        await anyio.sleep(wait)
        self._next = 0
        return True

    async def next(self) -> RoutePlan | None:
        """The next model's plan (skipping models that cannot plan); None when none is left."""
        while self.has_more:
            try:
                return await self._take()
            except GatewayError as err:
                if not self._skippable(err):
                    raise
        return None

    async def _take(self) -> RoutePlan:
        model = self._models[self._next]
        self._next += 1
        self._info.model = model.id
        return await self._ask(model)

    def _skippable(self, err: GatewayError) -> bool:
        """A walk of several models skips one that cannot plan (a walk of one has nothing
        to skip to, so its error is the answer at once); a bus failure is never skipped."""
        return len(self._models) > 1 and not isinstance(err, _CONTROL_PLANE_DOWN)
