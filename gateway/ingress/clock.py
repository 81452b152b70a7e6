"""The ingress's time sources, injected so the replay can run the real path on virtual time.

Production uses the process clocks; ``llmgw replay`` hands in readers of its virtual loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True, slots=True)
class IngressClock:
    """``steady``: monotonic seconds (budgets, latencies, TTFT, pins, lease ages); ``wall``:
    Unix seconds (observation timestamps the actors window their evidence by)."""

    steady: Callable[[], float] = time.perf_counter
    wall: Callable[[], float] = time.time


SYSTEM_CLOCK = IngressClock()
