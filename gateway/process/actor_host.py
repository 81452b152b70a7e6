"""Hosting the actor tree in a gateway process (roles ``all`` and ``actors``).

The one process-wiring module that imports ``actors``: ``gateway.process.serve`` imports it only for
those roles, so an ``--role ingress`` process never loads the actors package. It opens the
snapshot store beside the database, builds and starts the tree, keeps the stream of operator
events (JetStream on NATS; a bounded in-memory one in process) and attaches the ConfigActor
(admin area ``config``), which reloads with routers validated by the strategies.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from actors import ChildSpec, ConfigActor, ConfigState, SnapshotStore, Supervisor, build_tree
from actors.strategies import validate_strategy
from bus import BusClosedError
from gateway.process.config import DEMO_CONFIG, load_config
from gateway.process.control import EVENTS_STREAM, config_version, load_versioned
from schemas import subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)


def load_checked_config(path: str | None) -> GatewayConfig:
    """The config at ``path`` validated whole, routers and their params included (the
    strategies are the actors'). Raises ConfigError."""
    return load_config(path, routers=validate_strategy)


class ActorHost:
    """Owns this process's running actor tree and its snapshot store."""

    def __init__(self, root: Supervisor, snapshots: SnapshotStore) -> None:
        self.root = root
        self._snapshots = snapshots

    @classmethod
    async def start(cls, bus: Bus, config: GatewayConfig, config_path: str | None) -> ActorHost:
        """Start the tree for ``config`` on ``bus`` and attach the ConfigActor. Raises what
        opening the snapshots, starting the tree or ``add_child`` raises (after stopping
        whatever had started)."""
        snapshots = await SnapshotStore.open(config.database.path)
        build = functools.partial(build_tree, snapshots=snapshots, request_log=True)
        host = cls(build(config), snapshots)
        try:
            await host.root.start(bus)
            await _start_control(host.root, bus, config, config_path, build)
        except BaseException:
            await host.aclose()
            raise
        return host

    async def wait(self) -> None:
        """Return (or raise SupervisorGaveUpError) when the tree ends."""
        await self.root.wait()

    async def aclose(self) -> None:
        """Stop the tree, then close the snapshots."""
        try:
            await self.root.stop()
        finally:
            await self._snapshots.aclose()


async def _start_control(
    root: Supervisor,
    bus: Bus,
    config: GatewayConfig,
    config_path: str | None,
    build: Callable[[GatewayConfig], Supervisor],
) -> None:
    """Ensure the events stream (on any bus) and attach the ConfigActor to the running
    ``root``; ``build`` makes a tree description the way ``root`` was built.

    Raises what ``add_child`` raises; a stream the bus refuses is logged, not raised.
    """
    if config.events.stream:
        try:
            await bus.ensure_stream(
                EVENTS_STREAM,
                [subjects.EVENTS_ANY],
                max_age=config.events.stream_max_age_seconds,
                max_msgs=config.events.stream_max_msgs,
            )
        except BusClosedError as exc:  # live events still flow; only catching up is lost
            logger.error(
                "events are not kept for replay (is JetStream on? nats-server -js): %s", exc.message
            )
    source = config_path or f"<bundled {DEMO_CONFIG}>"
    state = ConfigState(config, config_version(config_path), build(config), source)
    load = functools.partial(load_versioned, config_path, routers=validate_strategy)
    await root.add_child(
        ChildSpec("config", functools.partial(ConfigActor, root, state, load=load, build=build))
    )
