"""ClusterConfigActor: a config reload that reaches every actors host of a cluster (admin
area ``config``).

Every host runs one, outside placement. The admin area is served in one queue group: the
host that takes ``config.reload`` (``llmgw admin reload``, ``POST /admin/config/reload``,
SIGHUP on any host) re-reads its own file, validated as at startup, asks the chains' owner
(wherever it runs) whether a chain would name a model the file lacks and refuses the reload
if so (``actors.config_owner.check_chains``, as one host's ConfigActor does), reconciles the
units it runs with it (``ClusterHost.reconfigure``) and publishes ``ConfigChanged``. Every
other host follows that event, as ingresses and the sidecars do: it re-reads its own file
and, when its version is not the one it runs, reconciles its units the same way. Units a
host starts later (a takeover, a handback) are built from the config it runs by then. The
hosts' files must agree, as the ingresses' must; a host whose file differs from the
announced version logs it and runs its own. ``show`` returns this host's running version
and model ids.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea
from actors.base import Actor, ActorContext, Serve
from actors.config_owner import (
    ReloadFailedError,
    check_chains,
    kept_at_start,
    model_changes,
    warn_unpriced,
)
from schemas import AdminCommand, ConfigChanged, GatewayError, subjects

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from bus import Envelope
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_QUEUE = "cluster_config"


class ClusterConfigActor(Actor):
    """Owns the config this host's units run. ``load`` re-reads and validates this host's
    file (raising InvalidRequestError with startup's message); ``reconfigure`` applies a
    config to the running units and returns the changes (raising what a child's start
    raises, with the old units still running). ``reload`` raises InvalidRequestError for an
    invalid file and ReloadFailedError when applying failed."""

    def __init__(
        self,
        node_id: str,
        config: GatewayConfig,
        version: str,
        *,
        load: Callable[[], tuple[GatewayConfig, str]],
        reconfigure: Callable[[GatewayConfig], Awaitable[list[str]]],
        source: str = "",
    ) -> None:
        """``source`` names this host's file in answers and events."""
        self.name = "cluster_config"
        self._node_id = node_id
        self._config = config
        self._version = version
        self._load = load
        self._reconfigure = reconfigure
        self._source = source
        self.admin = AdminArea(
            "config",
            {"reload": self._reload, "show": self._show},
            args={"reload": frozenset(), "show": frozenset()},
        )
        self.serves = (
            Serve(self.admin.serve.subject, queue=_QUEUE),
            Serve(subjects.event("config")),
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Nothing to build: the running config was given."""
        self.ctx = ctx

    async def handle(self, env: Envelope) -> None:
        """An admin command of area ``config``, or another host's ``ConfigChanged``."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)
        elif isinstance(env.message, ConfigChanged):
            await self._follow(env.message)

    @property
    def version(self) -> str:
        """The version of the config this host runs."""
        return self._version

    async def _show(self, cmd: AdminCommand) -> dict[str, Any]:
        return {
            "version": self._version,
            "source": self._source,
            "models": [m.id for m in self._config.models],
            "node_id": self._node_id,
        }

    async def _reload(self, cmd: AdminCommand) -> dict[str, Any]:
        config, version = self._load()  # raises InvalidRequestError: nothing changed
        config, at_start = kept_at_start(self._config, config)
        await check_chains(self.ctx.bus, config, self._source)  # raises: nothing changed
        old = self._config
        children = await self._apply(config, version)
        models = model_changes(old, config)
        await self.ctx.publish(
            subjects.event("config"),
            ConfigChanged(
                version=version,
                source=self._source,
                added=tuple(models["added"]),
                changed=tuple(models["changed"]),
                removed=tuple(models["removed"]),
                by=cmd.by,
                ts=time.time(),
            ),
        )
        logger.info("config reloaded on %s (version %s): %s", self._node_id, version, models)
        return {
            "version": version,
            **models,
            "children": children,
            "node_id": self._node_id,
            "restart_needed": at_start,
        }

    async def _follow(self, announced: ConfigChanged) -> None:
        """Run what this host's file says now, when that is not what it runs."""
        try:
            config, version = self._load()
            if version == self._version:
                return  # our own announcement, or a file this host already runs
            if version != announced.version:
                logger.warning(
                    "config reload: this host's file (version %s) is not the announced %s; "
                    "running this host's",
                    version,
                    announced.version,
                )
            await self._apply(kept_at_start(self._config, config)[0], version)
        except GatewayError as err:
            logger.error("config reload not followed on %s: %s", self._node_id, err.message)
            return
        logger.info("config reload followed on %s (version %s)", self._node_id, version)

    async def _apply(self, config: GatewayConfig, version: str) -> list[str]:
        try:
            children = await self._reconfigure(config)
        except Exception as exc:  # a child failed to start: the old units still run
            raise ReloadFailedError(f"reload not applied: {type(exc).__name__}: {exc}") from exc
        self._config, self._version = config, version
        warn_unpriced(config)
        return children
