"""What the failover loop carries per request (``RequestInfo``), per attempt (``Attempt``) and
hands back for a whole answer (``Served``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.ingress.accounting import RequestRecord

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from gateway.adapters.base import JSON
    from schemas import Observation, RouteCandidate


@dataclass(slots=True)
class RequestInfo:
    """Who asked for what; carried into every observation of the request, with the record
    the request's accounting fills (its attempts)."""

    request_id: str
    surface: str
    stream: bool
    caller: str = ""
    prompt_estimate: int = 0
    started: float = field(default_factory=time.perf_counter)
    role: str | None = None
    record: RequestRecord = field(default_factory=RequestRecord)
    on_attempt: Callable[[Observation], None] | None = None
    """Called with each attempt's Observation (the request's limits lease settles from them)."""


class Attempt(NamedTuple):
    """One attempt to make: its number in the request, the candidate, whether another
    candidate follows, whether it is the first of its model's plan (the one holding that
    model's prefill lease), and that model (the plan's)."""

    number: int
    candidate: RouteCandidate
    more: bool
    first_of_plan: bool
    model: str


@dataclass(slots=True)
class Served:
    """A successful non-streaming answer, the candidate that served it and its model.
    ``settle``: the attempt's settling (its observation, its lease given back), left for
    ``Dispatcher.call`` to run once the answer is written; None once settled."""

    body: JSON
    candidate: RouteCandidate
    attempts: int
    model: str
    settle: Callable[[], Coroutine[Any, Any, None]] | None = None
