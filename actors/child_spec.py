"""What a supervisor is told about its children, in OTP terms: a :class:`ChildSpec` per
child (how to make it, when to restart it, how long it may take to stop), and the
supervisor's :class:`Strategy` (which children a restart takes along)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.base import Actor
    from actors.supervisor import Supervisor


class Strategy(enum.Enum):
    """Which children a supervisor restarts when one exits and must be restarted."""

    ONE_FOR_ONE = "one_for_one"  # that child only
    ONE_FOR_ALL = "one_for_all"  # every child
    REST_FOR_ONE = "rest_for_one"  # that child and every child after it in the list


class Restart(enum.Enum):
    """When a child that exited is restarted."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only after a crash
    TEMPORARY = "temporary"  # never


@dataclass(frozen=True)
class ChildSpec:
    """How to make a child (``factory`` returns a fresh Actor or Supervisor per start)."""

    name: str
    factory: Callable[[], Actor | Supervisor]
    restart: Restart = Restart.PERMANENT
    shutdown: float = 5.0  # seconds to stop cleanly before it is cancelled
    # The one owner of a state that two incarnations must never answer for at once (a
    # capacity pool: both would grant): replaced break before make, see replace_child.
    exclusive: bool = False
