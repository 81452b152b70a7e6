"""Config reload, ingress side.

An ingress follows ``ConfigChanged`` (``llmgw.events.config``): it re-reads and validates its
own config file, validated exactly as at startup, and swaps the app's config atomically
(``GatewayApp.reconfigure``). A file that does not validate is refused whole — logged with
startup's message — and the running config stays. Requests in flight keep the model and plan
they started with; ``FallbackTargets`` keeps resolving the endpoints and credentials a
reload removed (``gateway.ingress.plan_walk``), so their attempts still reach the upstream.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from schemas import ConfigChanged, GatewayError, subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)


class Reconfigurable(Protocol):
    """What the follower swaps: the ingress app."""

    def reconfigure(self, config: GatewayConfig) -> None:
        """Serve ``config`` from now on."""
        ...


class ConfigFollower:
    """Owns an ingress's (or, ``who``, another follower's) view of which config version it
    serves.

    ``load`` re-reads and validates the ingress's own file, returning the config and its
    version; it raises GatewayError (InvalidRequestError with startup's message) to refuse.
    ``who`` names the follower in its log lines: a process running the ingress and the
    sidecars follows each reload twice.
    """

    def __init__(
        self,
        app: Reconfigurable,
        load: Callable[[], tuple[GatewayConfig, str]],
        version: str,
        who: str = "ingress",
    ) -> None:
        self._app = app
        self._load = load
        self.version = version
        self._who = who

    def sync(self, announced: str | None = None) -> bool:
        """Re-read the file and swap when it changed; True when it swapped.

        A file that does not validate is refused (logged) and the running config stays.
        """
        try:
            config, version = self._load()
        except GatewayError as err:
            logger.error(
                "config reload refused, the running config stays (%s): %s", self._who, err.message
            )
            return False
        if announced and version != announced:
            logger.warning(
                "the config file of this %s has version %s, the actors run %s",
                self._who,
                version,
                announced,
            )
        if version and version == self.version:
            return False
        self._app.reconfigure(config)
        logger.info(
            "%s: now serving config version %s (%d models)", self._who, version, len(config.models)
        )
        self.version = version
        return True

    async def follow(self, bus: Bus) -> None:
        """Apply every ConfigChanged until cancelled. Raises BusClosedError when the bus
        ends the subscription."""
        async with bus.subscribe(subjects.event("config")) as sub:
            async for env in sub:
                if isinstance(env.message, ConfigChanged):
                    self.sync(env.message.version)
