"""What one replayed config produced: one outcome per request, the gateway's observations and
its operator events, and what the simulated providers billed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas import Observation
    from schemas.config import GatewayConfig


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as its client saw it. ``t`` is its arrival in the trace, ``at`` when it was
    sent (virtual seconds from the start; equal unless the replay fell behind). ``ttft``:
    seconds to the first byte of the answer (a stream's first token; a whole answer
    otherwise); None unless served. ``broken``: a stream cut after its first byte."""

    id: str
    t: float
    request_id: str
    status: int
    served: bool
    broken: bool
    endpoint: str
    ttft: float | None
    at: float


@dataclass(frozen=True, slots=True)
class Transition:
    """An operator event, at virtual seconds from the start: ``kind`` circuit (``state`` the
    new circuit state), bench (benched/unbenched), key (a credential of the route ``endpoint``
    muted/unmuted) or mode (normal/degraded)."""

    at: float
    kind: str
    endpoint: str
    state: str


@dataclass(frozen=True, slots=True)
class RunResult:
    """Everything one config's replay collected, for the report."""

    name: str
    config: GatewayConfig
    outcomes: list[Outcome]
    observations: dict[str, list[Observation]]
    transitions: list[Transition]
    billed: dict[str, tuple[int, int]]
    """Per endpoint: (prompt tokens, completion tokens) its provider answered to clients'
    requests."""
    probes: dict[str, tuple[int, int]]
    """The same for the gateway's background probes (billed too, not in the requests' cost)."""
    duration: float
