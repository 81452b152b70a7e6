"""The control plane: actors that own routing state, and the supervisors that keep them up.

``Actor`` (base.py) owns one mailbox and handles one message at a time; ``Supervisor``
(supervisor.py) starts children in order, restarts them by OTP rules (``Strategy``,
``Restart``, intensity/period) and stops them in reverse. Supervisors nest into a tree whose
root the gateway starts with ``await root.start(bus)``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.admin import AdminArea
    from actors.base import Actor, ActorContext, Cancellable, Serve
    from actors.capacity import CapacityActor
    from actors.child_spec import ChildSpec, Restart, Strategy
    from actors.config_owner import ConfigActor, ConfigState
    from actors.endpoint import EndpointActor
    from actors.health import HealthActor
    from actors.model import ModelActor
    from actors.store import StoreActor
    from actors.stores.provider_keys_move import MovedKeys, move_provider_keys
    from actors.stores.snapshots import SnapshotStore
    from actors.supervisor import Supervisor, SupervisorGaveUpError
    from actors.tree import build_tree

# Each public name is imported on first use, not here: a process that needs one store (the
# CLI's ``keys`` on a database file) would otherwise import the whole actor tree, a second
# of start-up.
_HOMES = {
    "Actor": "actors.base",
    "ActorContext": "actors.base",
    "AdminArea": "actors.admin",
    "Cancellable": "actors.base",
    "CapacityActor": "actors.capacity",
    "ChildSpec": "actors.child_spec",
    "ConfigActor": "actors.config_owner",
    "ConfigState": "actors.config_owner",
    "EndpointActor": "actors.endpoint",
    "HealthActor": "actors.health",
    "ModelActor": "actors.model",
    "MovedKeys": "actors.stores.provider_keys_move",
    "Restart": "actors.child_spec",
    "Serve": "actors.base",
    "SnapshotStore": "actors.stores.snapshots",
    "StoreActor": "actors.store",
    "Strategy": "actors.child_spec",
    "Supervisor": "actors.supervisor",
    "SupervisorGaveUpError": "actors.supervisor",
    "build_tree": "actors.tree",
    "move_provider_keys": "actors.stores.provider_keys_move",
}


def __getattr__(name: str) -> object:
    """The public ``name``, imported from its module (and kept here) on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "Actor",
    "ActorContext",
    "AdminArea",
    "Cancellable",
    "CapacityActor",
    "ChildSpec",
    "ConfigActor",
    "ConfigState",
    "EndpointActor",
    "HealthActor",
    "ModelActor",
    "MovedKeys",
    "Restart",
    "Serve",
    "SnapshotStore",
    "StoreActor",
    "Strategy",
    "Supervisor",
    "SupervisorGaveUpError",
    "build_tree",
    "move_provider_keys",
]
