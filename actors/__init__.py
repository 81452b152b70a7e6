"""The control plane: actors that own routing state, and the supervisors that keep them up.

``Actor`` (base.py) owns one mailbox and handles one message at a time; ``Supervisor``
(supervisor.py) starts children in order, restarts them by OTP rules (``Strategy``,
``Restart``, intensity/period) and stops them in reverse. Supervisors nest into a tree whose
root the gateway starts with ``await root.start(bus)``.
"""

from __future__ import annotations

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
