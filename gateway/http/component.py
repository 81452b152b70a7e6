"""``Component``: the lifetime every part of the ingress shares, so the app holds them in one
list (started in order, told of each reloaded config, closed in reverse).

A part that needs no hook subclasses ``Component`` and keeps its do-nothing defaults; any
object with the three methods is one too (the protocol is structural)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from schemas.config import GatewayConfig


class Component(Protocol):
    """A part of the ingress with a lifetime. Each hook does nothing unless overridden."""

    async def start(self) -> None:
        """Start serving (subscriptions, views filled from their owners)."""
        return None

    def reconfigure(self, config: GatewayConfig) -> None:
        """Serve ``config`` from the next request on."""
        return None

    async def aclose(self) -> None:
        """Stop: let go of subscriptions, tasks and clients."""
        return None
