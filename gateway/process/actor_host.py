"""Hosting the actor tree in a gateway process (roles ``all`` and ``actors``).

The one process-wiring module that imports ``actors``: ``gateway.process.serve`` imports it only for
those roles, so an ``--role ingress`` process never loads the actors package. It opens the
snapshot store beside the database, builds and starts the tree, keeps the stream of operator
events (JetStream on NATS; a bounded in-memory one in process) and attaches the ConfigActor
(admin area ``config``), which reloads with routers validated by the strategies.

With ``cluster.enabled`` on ``--role actors`` the tree is shared by every actors host on the
NATS cluster instead (``actors.cluster.ClusterHost``): this host runs only its placed share,
with snapshots in JetStream, and a config reload reaches every host's share
(``actors.cluster.ClusterConfigActor``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import socket
import sqlite3
from typing import TYPE_CHECKING

from actors import (
    ChildSpec,
    ConfigActor,
    ConfigState,
    SnapshotStore,
    Supervisor,
    build_tree,
    move_provider_keys,
)
from actors.cluster import ClusterConfigActor, ClusterHost
from actors.config_owner import warn_unpriced
from actors.strategies import validate_strategy
from bus import BusClosedError, NoRespondersError, RequestTimeoutError
from gateway.process.config import DEMO_CONFIG, ConfigError, load_config
from gateway.process.control import config_version, load_versioned
from gateway.process.shared_database import require_shared_database
from schemas import AdminCommand, AdminReply, subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_RELOAD_TIMEOUT_S = 10.0


def load_checked_config(path: str | None) -> GatewayConfig:
    """The config at ``path`` validated whole, routers and their params included (the
    strategies are the actors'); warns of its unpriced routes. Raises ConfigError."""
    config = load_config(path, routers=validate_strategy)
    warn_unpriced(config)
    return config


def _load_checked_versioned(path: str | None) -> tuple[GatewayConfig, str]:
    """What a config reload loads: the config validated as :func:`load_checked_config`
    does, with the file's version; its unpriced routes are warned of by the reload that
    applies it (``actors.config_owner.warn_unpriced``). Raises InvalidRequestError carrying
    startup's message."""
    return load_versioned(path, routers=validate_strategy)


def default_node_id() -> str:
    """A node id unique per process, even for two on one machine: host name, pid, random."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class ActorHost:
    """Owns this process's running actor tree and its snapshot store (or, in a cluster,
    this host's share of the tree)."""

    def __init__(
        self,
        root: Supervisor,
        snapshots: SnapshotStore | None,
        cluster: ClusterHost | None = None,
    ) -> None:
        self.root = root
        self.cluster = cluster
        self._snapshots = snapshots

    @classmethod
    async def start_cluster(
        cls,
        bus: Bus,
        config: GatewayConfig,
        node_id: str | None,
        on_units: Callable[[list[str]], None] | None = None,
        config_path: str | None = None,
    ) -> ActorHost:
        """Join the actors hosts of the NATS cluster as ``node_id`` (default:
        :func:`default_node_id`) and run this host's share; ``on_units`` is shown the units
        it runs whenever they change (see ``ClusterHost``). Raises BusClosedError when
        JetStream's buckets cannot be opened, SharedDatabaseRequiredError when other hosts
        run and the request log would be in this host's SQLite file, and what
        ``move_provider_keys`` raises when this host's file holds provider keys."""
        node_id = node_id or default_node_id()
        moved = None
        if config.database.url:
            moved = await move_provider_keys(config.database.path, config.database.url)
        reloads = ClusterConfigActor(
            node_id,
            config,
            config_version(config_path),
            load=functools.partial(_load_checked_versioned, config_path),
            reconfigure=lambda new: cluster.reconfigure(_shared_tree(new)),
            source=_source(config_path),
        )
        cluster = ClusterHost(
            bus,
            node_id,
            config.cluster,
            _shared_tree(config),
            on_units=on_units,
            config_version=lambda: reloads.version,  # each beat says it (cluster members)
        )
        host = cls(cluster.root, None, cluster)
        try:
            # Kept from before a unit starts here: what its actors say as they start.
            await _ensure_events_stream(bus, config)
            # Refused before joining: a host whose request log is in its own SQLite file
            # would split the log and spend with the hosts already running.
            await cluster.start(functools.partial(require_shared_database, config, node_id=node_id))
            await cluster.root.add_child(ChildSpec("cluster_config", lambda: reloads))
        except BaseException:
            await host.aclose()
            raise
        if moved:
            await _reload_provider_keys(bus, node_id)
        logger.info("cluster: %s runs %s", node_id, ", ".join(cluster.units) or "nothing yet")
        return host

    @classmethod
    async def start(
        cls,
        bus: Bus,
        config: GatewayConfig,
        config_path: str | None,
        *,
        events_in_memory: bool = False,
    ) -> ActorHost:
        """Start the tree for ``config`` on ``bus`` and attach the ConfigActor; the events
        stream is kept in the bus servers' memory with ``events_in_memory``. Raises what
        opening the snapshots, starting the tree or ``add_child`` raises (after stopping
        whatever had started)."""
        try:
            snapshots = await SnapshotStore.open(config.database.path)
        except (sqlite3.Error, OSError) as exc:  # a directory, no permission, a full disk
            raise ConfigError(
                f"{config_path or '<the demo config>'}: database.path: cannot open "
                f"{config.database.path}: {exc}"
            ) from None
        build = functools.partial(build_tree, snapshots=snapshots, request_log=True)
        host = cls(build(config), snapshots)
        try:
            # Kept from before the tree starts: what its actors say as they start (a stored
            # rule set disabled, a chain that lost a model) is replayed like any event.
            await _ensure_events_stream(bus, config, memory=events_in_memory)
            await host.root.start(bus)
            await _start_control(host.root, config, config_path, build)
        except BaseException:
            await host.aclose()
            raise
        return host

    async def wait(self) -> None:
        """Return (or raise SupervisorGaveUpError) when the tree ends."""
        await self.root.wait()

    async def aclose(self) -> None:
        """Stop the tree (releasing this host's share, in a cluster), then close the
        snapshots."""
        try:
            if self.cluster is not None:
                await self.cluster.aclose()
            await self.root.stop()
        finally:
            if self._snapshots is not None:
                await self._snapshots.aclose()


async def _reload_provider_keys(bus: Bus, node_id: str) -> None:
    """Ask the ``keys`` unit's owner, wherever it runs, to re-read the provider keys this
    host just moved into PostgreSQL. No owner yet is fine: it reads them when it starts."""
    try:
        await bus.request(
            subjects.admin("provider_keys", "reload"),
            AdminCommand(by=f"cluster:{node_id}"),
            reply_type=AdminReply,
            timeout=_RELOAD_TIMEOUT_S,
        )
    except (RequestTimeoutError, NoRespondersError):
        logger.info("cluster: no keys owner answered yet; it reads the moved keys when it starts")


def _shared_tree(config: GatewayConfig) -> Callable[[SnapshotStore | None], Supervisor]:
    """How a cluster host describes the whole tree of ``config`` for a unit's snapshots."""
    return lambda snapshots: build_tree(
        config, snapshots=snapshots, request_log=True, shared_state=True
    )


async def _start_control(
    root: Supervisor,
    config: GatewayConfig,
    config_path: str | None,
    build: Callable[[GatewayConfig], Supervisor],
) -> None:
    """Attach the ConfigActor to the running ``root``; ``build`` makes a tree description the
    way ``root`` was built. Raises what ``add_child`` raises."""
    state = ConfigState(config, config_version(config_path), build(config), _source(config_path))
    load = functools.partial(_load_checked_versioned, config_path)
    await root.add_child(
        ChildSpec("config", functools.partial(ConfigActor, root, state, load=load, build=build))
    )


def _source(config_path: str | None) -> str:
    """How reload answers and events name the file a config came from."""
    return config_path or f"<bundled {DEMO_CONFIG}>"


async def _ensure_events_stream(bus: Bus, config: GatewayConfig, *, memory: bool = False) -> None:
    """Keep operator events for replay when configured (in the bus servers' memory with
    ``memory``); a refusal is logged, not raised."""
    if config.events.stream:
        try:
            await bus.ensure_stream(
                subjects.EVENTS_STREAM,
                [subjects.EVENTS_ANY],
                max_age=config.events.stream_max_age_seconds,
                max_msgs=config.events.stream_max_msgs,
                max_msgs_per_subject=config.events.stream_max_msgs_per_kind,
                replicas=config.cluster.replicas_on(bus.servers) if config.cluster.enabled else 1,
                grow_only=config.cluster.replicas is None,  # a count of the servers seen
                memory=memory,
            )
        except BusClosedError as exc:  # live events still flow; only catching up is lost
            logger.error(
                "events are not kept for replay (is JetStream on? nats-server -js): %s", exc.message
            )
