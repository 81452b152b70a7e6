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

Each plan a walk returns names its model (``RoutePlan.model``, stamped by the model's owner);
the failover loop carries it into each attempt, so nothing about the request changes behind
the loop's back while it walks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from bus import BusClosedError
from schemas import BusTimeoutError, GatewayError, NoRespondersError

if TYPE_CHECKING:
    from gateway.steering.resolver import Resolution
    from schemas import RoutePlan
    from schemas.config import ModelConfig

Ask = Callable[["ModelConfig"], Awaitable["RoutePlan"]]

_CONTROL_PLANE_DOWN = (BusTimeoutError, NoRespondersError, BusClosedError)


class PlanWalk:
    """Owns the position of one request in its ordered models."""

    __slots__ = ("_ask", "_models", "_next", "steered")

    def __init__(
        self, models: Sequence[ModelConfig], ask: Ask, steered: Resolution | None = None
    ) -> None:
        self._models = models
        self._ask = ask
        self._next = 0
        self.steered = steered

    @property
    def has_more(self) -> bool:
        """Whether another model may still be asked for a plan."""
        return self._next < len(self._models)

    async def first(self) -> RoutePlan:
        """The first plan any model makes. Raises the first model's GatewayError when none
        can plan."""
        first_error: GatewayError | None = None
        while self.has_more:
            try:
                plan = await self._take()
            except GatewayError as err:
                if not self._skippable(err):
                    raise
                first_error = first_error or err
                continue
            return plan
        assert first_error is not None
        raise first_error

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
        return await self._ask(model)

    def _skippable(self, err: GatewayError) -> bool:
        """A walk of several models skips one that cannot plan (a walk of one has nothing
        to skip to, so its error is the answer at once); a bus failure is never skipped."""
        return len(self._models) > 1 and not isinstance(err, _CONTROL_PLANE_DOWN)
